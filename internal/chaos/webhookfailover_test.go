package chaos_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestFailoverWebhooks is webhook delivery through a failover: two
// merchants' webhook endpoints on a local receiver (as in
// TestWebhooksSurviveCrashes) while clients charge, and the primary's
// postmaster SIGKILLed while the receiver holds a delivery request; Patroni
// promotes the sync standby. Once every delivery is settled, on the new
// leader: every event each endpoint subscribes to reached it at least once,
// signed, and no other event did, nor any the database does not have (a
// delivery of an event the failover lost); every attempt recorded with a
// status was received; every delivery marked delivered has a recorded 2xx
// attempt. The charges are audited as in every failover scenario.
func TestFailoverWebhooks(t *testing.T) {
	runFailover(t, failoverScenario{
		name:        "failover: primary SIGKILLed with webhook deliveries in flight",
		faults:      "SIGKILL of the primary's postmaster with a delivery request held; Patroni promotes the sync standby",
		primaryLost: true,
		// Paced, so that the endpoints keep up and the deliveries settle soon
		// after the load ends.
		pace:     300 * time.Millisecond,
		webhooks: true,
		fault: func(t *testing.T, _ context.Context, _ *cluster, at settled) error {
			return killLogged(t, at.leader, "the primary")
		},
	})
}

// failoverHooks is the webhook side of a failover scenario: the receiver, the
// endpoints on it (threeEndpoints), an account of the first merchant with no
// money, and the second merchant's client and account. The methods of a nil
// *failoverHooks do nothing.
type failoverHooks struct {
	recv       *hookReceiver
	endpoints  []hookEndpoint
	s          *scenario
	c          *client // the first merchant's
	empty      string  // the first merchant's account that has no money
	other      *client
	otherAcct  string
	unresolved atomic.Int64 // charge's charges without a definite answer
	held       atomic.Int64 // requests the receiver had in flight at the fault
	struckAt   time.Time    // when whileHeld, done waiting, began the fault
}

// startHooks makes the endpoints of s's two merchants on svc, with c the
// first merchant's client, opens an account of the first that stays empty,
// and funds an account of the second.
func startHooks(t *testing.T, s *scenario, c *client, svc *service) *failoverHooks {
	t.Helper()
	other := s.merchants[1]
	h := &failoverHooks{s: s, c: c, other: newClient(t, other.APIKey, "hookfailover-other-", func(int) string { return svc.url() })}
	h.recv, h.endpoints = threeEndpoints(t, s.ctx, c, s.merchants[0], h.other, other)
	h.empty = c.mustAccount(t, s.ctx, usd)
	h.otherAcct = h.other.mustAccount(t, s.ctx, usd)
	h.other.mustDeposit(t, s.ctx, h.otherAcct, 1_000_000)
	return h
}

// charge starts a client that charges, pausing up to pace between charges,
// until stop closes: in turn the second merchant's account, and the first
// merchant's empty one, whose charges fail (charge.failed, an event /charges
// does not subscribe to) and are recorded for the audit. wg counts it.
func (h *failoverHooks) charge(ctx context.Context, stop <-chan struct{}, wg *sync.WaitGroup, pace time.Duration) {
	if h == nil {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for turn := 0; ; {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(rand.N(pace) + time.Millisecond):
			}
			c, acct := h.other, h.otherAcct
			if turn++; turn%2 == 0 {
				c, acct = h.c, h.empty
			}
			amount := 1 + rand.Int64N(500)
			o := drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount)})
			switch {
			case o.answer.status == 0:
				h.unresolved.Add(1)
			case c == h.c:
				h.s.record(o)
			}
		}
	}()
}

// whileHeld returns fault made to wait first, up to 20 s, until the receiver
// has a delivery request in flight (one in eight is held 300 ms to 1 s), so
// that the fault strikes the Deliverer between its POST and the record of
// the attempt. It fails t when none came.
func (h *failoverHooks) whileHeld(fault func(*testing.T, context.Context, *cluster, settled) error,
) func(*testing.T, context.Context, *cluster, settled) error {
	if h == nil {
		return fault
	}
	return func(t *testing.T, ctx context.Context, c *cluster, at settled) error {
		began := time.Now()
		for h.recv.inFlight.Load() == 0 && time.Since(began) < 20*time.Second {
			time.Sleep(time.Millisecond)
		}
		h.held.Store(h.recv.inFlight.Load())
		if h.held.Load() == 0 {
			t.Error("the receiver had no delivery request in flight in the 20 s before the fault: the fault missed what the scenario is about")
		}
		t.Logf("%d delivery requests in flight at the receiver, %v after the cluster settled", h.held.Load(), time.Since(began).Round(time.Millisecond))
		h.struckAt = time.Now()
		return fault(t, ctx, c, at)
	}
}

// struck returns when the fault began: began (settleAndFault's), or later
// when whileHeld waited for a request in flight before it.
func (h *failoverHooks) struck(began time.Time) time.Time {
	if h == nil || h.struckAt.Before(began) {
		return began
	}
	return h.struckAt
}

// await waits, while the service still runs, until every delivery is
// settled (awaitDeliveries), and returns how long that took.
func (h *failoverHooks) await(t *testing.T, ctx context.Context, db *pgxpool.Pool) time.Duration {
	t.Helper()
	if h == nil {
		return 0
	}
	began := time.Now()
	awaitDeliveries(t, ctx, db, scale(time.Minute, 5*time.Minute))
	return time.Since(began)
}

// hookFigures is what the webhook side adds to a failover scenario's
// summary.
type hookFigures struct {
	requests         int64
	faults           string
	lost, violations int
}

// judge holds the receiver against the database (judgeHooks) once the
// service has stopped, logs what it found, and returns the figures for the
// summary. faultAt is when the fault began; drain, how long the deliveries
// took to settle after the load (await).
func (h *failoverHooks) judge(t *testing.T, ctx context.Context, db *pgxpool.Pool, faultAt time.Time, drain time.Duration) hookFigures {
	t.Helper()
	if h == nil {
		return hookFigures{}
	}
	v := judgeHooks(t, ctx, db, h.endpoints)
	first := firstDeliveryAfter(t, ctx, db, h.recv, h.endpoints, faultAt)
	// Only an attempt in flight at the fault (32 at most in all) can lose its
	// record: its POST made, the primary gone before the attempt committed.
	cut := 0
	if v.unrecorded > deliveriesInFlight {
		cut = v.unrecorded - deliveriesInFlight
		t.Errorf("%d requests received without a recorded attempt: more than the %d one fault can cut", v.unrecorded, deliveriesInFlight)
	}
	st := h.other.stats
	bad := int(st.internal.Load() + st.badProblems.Load())
	if bad > 0 {
		t.Errorf("the second merchant's client: %d answers were 500, %d 503/409 problems lacked their type or Retry-After",
			st.internal.Load(), st.badProblems.Load())
	}
	t.Logf("webhooks: %d events to deliver to 3 endpoints, %d requests received: %d duplicates, %d cut by the fault before their attempt "+
		"was recorded, %d failed attempts recorded, %d of events the database does not have; %d requests in flight at the fault; "+
		"the first event made after the fault reached an endpoint %v after it; every delivery settled %v after the load; "+
		"the second merchant's client sent %d requests (%d unresolved)",
		v.events, v.received, v.duplicates, v.unrecorded, v.failures, v.ghosts, h.held.Load(),
		first.Round(10*time.Millisecond), drain.Round(100*time.Millisecond), h.other.stats.requests.Load(), h.unresolved.Load())
	return hookFigures{
		requests: h.other.stats.requests.Load(),
		faults: "; " + itoa(int64(v.events)) + " deliveries to 3 endpoints, " + itoa(h.held.Load()) + " in flight at the fault, " +
			itoa(int64(v.duplicates)) + " sent twice; first event after the fault delivered " + first.Round(100*time.Millisecond).String() + " after it",
		lost:       v.lost,
		violations: v.violations() + int(h.unresolved.Load()) + cut + bad,
	}
}

// firstDeliveryAfter is the time from since to the arrival of the first
// delivery request, at any of endpoints, of an event made after since
// (0 when there is none, which fails t).
func firstDeliveryAfter(t *testing.T, ctx context.Context, db *pgxpool.Pool, recv *hookReceiver, endpoints []hookEndpoint, since time.Time) time.Duration {
	t.Helper()
	rows, _ := db.Query(ctx, `SELECT 'evt_' || replace(id::text, '-', '') FROM events WHERE created_at > $1`, since)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err, "read the events made after the fault")
	after := map[string]bool{}
	for _, id := range ids {
		after[id] = true
	}
	var first time.Time
	for _, e := range endpoints {
		for _, r := range recv.requests(e.path) {
			if after[r.eventID] && (first.IsZero() || r.at.Before(first)) {
				first = r.at
			}
		}
	}
	if first.IsZero() {
		t.Errorf("no event made after the fault reached an endpoint (%d events after it)", len(after))
		return 0
	}
	return first.Sub(since)
}
