package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	paymentsclient "github.com/exactlyonce/payments/client"
)

// maxEndpoints is how many live webhook endpoints a merchant may have.
const maxEndpoints = 16

// deliveredWithin is how soon after its event's created_at a delivery to a
// healthy endpoint must arrive, whatever other merchants' endpoints do: a
// delivery normally takes tens of milliseconds (docs/benchmarks.md), so the
// bound is a wide margin, and a miss is a Deliverer busy with someone else.
const deliveredWithin = time.Second

// TestWebhookHangingMerchantStarvesNoOne is one merchant's broken receivers
// beside another's healthy one. Merchant A has 16 webhook endpoints on a
// receiver that accepts every request and never answers (it holds each until
// the Deliverer's 10 s timeout cuts it), and makes a backlog of 30 events (60
// in the long version): 480 deliveries that can only time out. Once A's
// requests are held, merchant B, with one endpoint on a receiver that answers
// 204 at once, charges one at a time, every 2 s (3 s), 12 times (30). Every
// one of B's events must reach B's endpoint within 1 s of its created_at, and
// nothing of A's may reach it; A's deliveries are not lost: every one was
// made and stays pending, with no attempt recorded as answered.
func TestWebhookHangingMerchantStarvesNoOne(t *testing.T) {
	var (
		backlog = scale(30, 60)
		bEvents = scale(12, 30)
		bEvery  = scale(2*time.Second, 3*time.Second)
	)
	s := startScenario(t, scale(2*time.Minute, 6*time.Minute), testDatabase, "starve-hanging", "starve-healthy")
	ctx, a, b := s.ctx, s.merchants[0], s.merchants[1]
	svc := newService(t, s.bin, serviceConfig{databaseURL: s.dbURL, extra: []string{"WEBHOOK_ALLOW_PRIVATE_NETWORKS=true"}})
	ac := newClient(t, a.APIKey, "starve-a-", func(int) string { return svc.url() })
	bc := newClient(t, b.APIKey, "starve-b-", func(int) string { return svc.url() })

	// Held until the client gives up: hookReceiver ends a hold when the
	// request's context does, which the Deliverer's timeout closes.
	hanging := &hookReceiver{hold: func() time.Duration { return time.Hour }}
	hangingURL := hanging.listen(t, "127.0.0.1:0").URL
	var aHooks []hookEndpoint
	for i := range maxEndpoints {
		aHooks = append(aHooks, mustEndpoint(t, ctx, ac, a, hanging, hangingURL, fmt.Sprintf("/a%02d", i), "*"))
	}
	healthy := &hookReceiver{}
	bHook := mustEndpoint(t, ctx, bc, b, healthy, healthy.listen(t, "127.0.0.1:0").URL, "/b", "*")

	// A's account: its first event, held at its 16 endpoints. Until the
	// Deliverer has fanned out to a live endpoint it only polls, once a
	// second (docs/webhooks.md): B's events are timed after that.
	aAcct := ac.mustAccount(t, ctx, usd)
	awaitHeld(t, hanging, 1, 5*time.Second)
	// B's account and its deposit, delivered before A's backlog.
	var bOps []op
	bAcct := bc.mustAccount(t, ctx, usd)
	bOps = append(bOps, mustDrive(t, ctx, bc, depositOp(bAcct, 1_000_000), http.StatusCreated))
	if !awaitArrived(healthy, bHook, subscribedEvents(t, ctx, s.db, bHook), 5*time.Second) {
		t.Fatal("merchant B's first two events did not reach its endpoint within 5 s, before merchant A's backlog")
	}

	// A's backlog: a deposit, then charges, as fast as they are answered.
	s.record(mustDrive(t, ctx, ac, depositOp(aAcct, 1_000_000), http.StatusCreated))
	for range backlog - 2 {
		amount := 1 + rand.Int64N(500)
		s.record(mustDrive(t, ctx, ac, op{kind: "charge", path: "/v1/charges", account: aAcct, amount: amount, body: chargeBody(aAcct, amount)}, http.StatusCreated))
	}
	busy := awaitHeld(t, hanging, maxEndpoints, 20*time.Second)

	// B's charges, one at a time, while A's endpoints hold the Deliverer.
	var peakHeld int64
	for i := range bEvents {
		if i > 0 {
			time.Sleep(bEvery)
		}
		peakHeld = max(peakHeld, hanging.inFlight.Load())
		amount := 1 + rand.Int64N(500)
		bOps = append(bOps, mustDrive(t, ctx, bc, op{kind: "charge", path: "/v1/charges", account: bAcct, amount: amount, body: chargeBody(bAcct, amount)}, http.StatusCreated))
	}
	// The last may take its second; then what has not arrived is late.
	want := subscribedEvents(t, ctx, s.db, bHook)
	awaitArrived(healthy, bHook, want, scale(5*time.Second, 10*time.Second))
	stoppedAt := time.Now()
	svc.stop()

	// B: every event within deliveredWithin of its created_at, once, signed.
	lag := deliveryLags(t, ctx, s.db, bHook, stoppedAt)
	bSeen := checkRequests(t, ctx, s.db, bHook)
	if lag.late > 0 {
		t.Errorf("merchant B's endpoint: %d of its %d events did not arrive within %v of their created_at: %d had not arrived when the service stopped, "+
			"the oldest %v after its event; of those that arrived, the latest took %v; A's %d endpoints held %d requests at once",
			lag.late, lag.events, deliveredWithin, lag.missing, lag.maxMissing.Round(100*time.Millisecond), lag.max.Round(time.Millisecond), maxEndpoints, peakHeld)
	}
	if bSeen.duplicates > 0 {
		t.Errorf("merchant B's endpoint got %d of its events twice, with no fault to repeat them", bSeen.duplicates)
	}

	a0 := judgeHanging(t, ctx, s.db, hanging, aHooks)
	money := auditMerchants(t, ctx, s.db, ledger{a.ID, s.recorded()}, ledger{b.ID, bOps})
	t.Logf("merchant A: %d events, %d deliveries pending to %d endpoints held until the timeout (%d held %v after the backlog, at most %d while B charged), "+
		"%d attempts recorded (%d of them timed out), %d requests received; merchant B: %d events, %d arrived within %v, the latest of those that "+
		"arrived %v after its event, %d not at all (the oldest of those %v old when the service stopped)",
		a0.events, a0.pending, maxEndpoints, busy.held, busy.after.Round(time.Millisecond), peakHeld,
		a0.attempts, a0.timedOut, a0.received, lag.events, lag.events-lag.late, deliveredWithin, lag.max.Round(time.Millisecond),
		lag.missing, lag.maxMissing.Round(100*time.Millisecond))

	summary{
		scenario: "webhooks: one merchant's 16 hanging endpoints beside another's healthy one",
		requests: ac.stats.requests.Load() + bc.stats.requests.Load(),
		faults: itoa(maxEndpoints) + " endpoints holding every request until the 10 s timeout, " + itoa(int64(a0.events*maxEndpoints)) +
			" deliveries backlogged; of the other merchant's " + itoa(int64(lag.events)) + " events, " + itoa(int64(lag.late)) + " later than " +
			deliveredWithin.String() + ", " + itoa(int64(lag.missing)) + " never (the oldest " + lag.maxMissing.Round(time.Second).String() +
			"); the latest that arrived took " + lag.max.Round(time.Millisecond).String(),
		duplicates: money.duplicates,
		lost:       money.lost + lag.missing + a0.lost,
		violations: money.violations + lag.late + bSeen.duplicates + bSeen.foreign + bSeen.badSigs + a0.violations,
		command:    reproduce("TestWebhookHangingMerchantStarvesNoOne"),
	}.log(t, time.Since(s.began))
}

// hangingVerdict is what judgeHanging found of a merchant whose endpoints never
// answer.
type hangingVerdict struct {
	events, pending              int // the merchant's events; its deliveries pending
	attempts, timedOut, received int // attempts recorded, those that timed out; requests received
	lost, violations             int
}

// judgeHanging holds the endpoints of a merchant whose receiver never
// answers against the database: every request signed and of an event the
// endpoint subscribes to; a delivery made of every event to every endpoint,
// each still pending (lost counts those missing or ended otherwise); no
// attempt recorded with an HTTP status. It fails t for each problem.
func judgeHanging(t *testing.T, ctx context.Context, db *pgxpool.Pool, recv *hookReceiver, hooks []hookEndpoint) hangingVerdict {
	t.Helper()
	merchantID := hooks[0].merchantID
	var h hangingVerdict
	for _, e := range hooks {
		v := checkRequests(t, ctx, db, e)
		h.violations += v.foreign + v.badSigs
	}
	h.events = len(subscribedEvents(t, ctx, db, hooks[0]))
	st := deliveryStates(t, ctx, db, merchantID)
	want := h.events * len(hooks)
	h.pending, h.lost = st["pending"], want-st["pending"]
	if st.total() != want || h.pending != want {
		t.Errorf("merchant %s: %d deliveries made of the %d its %d events call for, in states %v; want every one made and pending",
			merchantID, st.total(), want, h.events, st)
	}
	answered := 0
	must(t, db.QueryRow(ctx, `SELECT count(status), count(*) FILTER (WHERE error LIKE 'no answer within%'), count(*)
	    FROM webhook_attempts WHERE merchant_id = $1`, merchantID).Scan(&answered, &h.timedOut, &h.attempts), "count attempts")
	if answered > 0 {
		t.Errorf("merchant %s: %d attempts recorded with an HTTP status, from endpoints that never answer", merchantID, answered)
	}
	h.violations += answered
	h.received = len(recv.all())
	return h
}

// ledger is a merchant's operations, for the audit.
type ledger struct {
	merchantID string
	ops        []op
}

// moneyVerdict is what auditMerchants found.
type moneyVerdict struct{ duplicates, lost, violations int }

// auditMerchants audits each merchant's tables (auditDatabase) and holds
// what its client was told against them (checkClientView).
func auditMerchants(t *testing.T, ctx context.Context, db *pgxpool.Pool, ledgers ...ledger) moneyVerdict {
	t.Helper()
	var v moneyVerdict
	for _, l := range ledgers {
		a := auditDatabase(t, ctx, db, l.merchantID)
		a.report(t)
		broken, gap := checkClientView(t, ctx, db, l.merchantID, l.ops)
		v.duplicates += a.duplicateCharges
		v.lost += int(gap) + a.missingEvents
		v.violations += a.violations() + broken
	}
	return v
}

// depositOp is a deposit of amount into account.
func depositOp(account string, amount int64) op {
	return op{kind: "deposit", path: "/v1/accounts/" + account + "/deposits", account: account,
		amount: amount, body: []byte(`{"amount":` + itoa(amount) + `}`)}
}

// held is how many requests a receiver held at once, and when.
type held struct {
	held  int64
	after time.Duration
}

// awaitHeld waits up to bound until recv holds want requests at once, and
// says how many it held then. It fails t if it held none: the scenario would
// miss what it is about.
func awaitHeld(t *testing.T, recv *hookReceiver, want int64, bound time.Duration) held {
	t.Helper()
	began := time.Now()
	for recv.inFlight.Load() < want && time.Since(began) < bound {
		time.Sleep(5 * time.Millisecond)
	}
	h := held{held: recv.inFlight.Load(), after: time.Since(began)}
	if h.held == 0 {
		t.Errorf("the hanging receiver held no request within %v", bound)
	}
	return h
}

// all is every request the receiver got, on any path.
func (r *hookReceiver) all() []hookRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []hookRequest
	for _, got := range r.got {
		all = append(all, got...)
	}
	return all
}

// awaitArrived waits up to bound until e's receiver has got every event of
// want, and reports whether it has.
func awaitArrived(recv *hookReceiver, e hookEndpoint, want map[string]bool, bound time.Duration) bool {
	for end := time.Now().Add(bound); ; time.Sleep(50 * time.Millisecond) {
		got := map[string]bool{}
		for _, r := range recv.requests(e.path) {
			got[r.eventID] = true
		}
		missing := 0
		for id := range want {
			if !got[id] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(end) {
			return missing == 0
		}
	}
}

// lags is how long after their events' created_at an endpoint's deliveries
// arrived.
type lags struct {
	events     int           // the events the endpoint subscribes to
	late       int           // arrived after deliveredWithin, or never
	missing    int           // never arrived
	max        time.Duration // the longest of those that arrived
	maxMissing time.Duration // the oldest of those that never did, at the end
}

// deliveryLags measures, for each event e subscribes to, the time from its
// created_at (the database's clock, the same machine's) to the arrival of
// its first request answered 2xx at e; one that never arrived counts until
// end.
func deliveryLags(t *testing.T, ctx context.Context, db *pgxpool.Pool, e hookEndpoint, end time.Time) lags {
	t.Helper()
	rows, _ := db.Query(ctx, `SELECT 'evt_' || replace(id::text, '-', ''), created_at FROM events
	    WHERE merchant_id = $1 AND ('*' = ANY ($2::text[]) OR type = ANY ($2::text[]))`, e.merchantID, e.events)
	type event struct {
		ID        string
		CreatedAt time.Time
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[event])
	must(t, err, "read the events of %s", e.path)
	arrived := map[string]time.Time{}
	for _, r := range e.recv.requests(e.path) {
		if first, ok := arrived[r.eventID]; r.status/100 == 2 && (!ok || r.at.Before(first)) {
			arrived[r.eventID] = r.at
		}
	}
	l := lags{events: len(events)}
	for _, ev := range events {
		at, ok := arrived[ev.ID]
		if !ok {
			l.missing++
			l.late++
			l.maxMissing = max(l.maxMissing, end.Sub(ev.CreatedAt))
			continue
		}
		lag := at.Sub(ev.CreatedAt)
		if lag > deliveredWithin {
			l.late++
		}
		l.max = max(l.max, lag)
	}
	return l
}

// seen is what an endpoint's requests held, against its subscriptions.
type seen struct {
	foreign    int // requests of events not its merchant's or not subscribed to
	badSigs    int // requests VerifyWebhook refused, or whose body is another event
	duplicates int // requests answered 2xx beyond one per event
}

// checkRequests checks every request e's receiver got: signed with e's
// secret, of an event of its merchant it subscribes to. It fails t for each
// that is not.
func checkRequests(t *testing.T, ctx context.Context, db *pgxpool.Pool, e hookEndpoint) seen {
	t.Helper()
	want := subscribedEvents(t, ctx, db, e)
	var v seen
	acked := map[string]int{}
	for _, r := range e.recv.requests(e.path) {
		var body struct{ ID string }
		if err := paymentsclient.VerifyWebhook(r.body, r.signature, e.secret, 10*time.Minute); err != nil ||
			json.Unmarshal(r.body, &body) != nil || body.ID != r.eventID {
			v.badSigs++
			t.Errorf("endpoint %s: delivery of %s (body id %q) does not verify: %v", e.path, r.eventID, body.ID, err)
		}
		if !want[r.eventID] {
			v.foreign++
			t.Errorf("endpoint %s (merchant %s, events %v) received %s, not one of its merchant's events it subscribes to",
				e.path, e.merchantID, e.events, r.eventID)
		}
		if r.status/100 == 2 {
			if acked[r.eventID]++; acked[r.eventID] > 1 {
				v.duplicates++
			}
		}
	}
	return v
}

// states counts a merchant's webhook deliveries by state.
type states map[string]int

func (s states) total() int {
	n := 0
	for _, c := range s {
		n += c
	}
	return n
}

func (s states) String() string {
	var parts []string
	for st, n := range s {
		parts = append(parts, fmt.Sprintf("%s %d", st, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// deliveryStates counts the merchant's deliveries by state.
func deliveryStates(t *testing.T, ctx context.Context, db *pgxpool.Pool, merchantID string) states {
	t.Helper()
	rows, _ := db.Query(ctx, `SELECT state, count(*) FROM webhook_deliveries WHERE merchant_id = $1 GROUP BY state`, uuid.MustParse(merchantID))
	s := states{}
	for rows.Next() {
		var (
			state string
			n     int
		)
		must(t, rows.Scan(&state, &n), "scan delivery states")
		s[state] = n
	}
	must(t, rows.Err(), "count deliveries by state")
	return s
}
