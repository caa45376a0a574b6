package chaos_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// TestCrashBetweenAuthorizationAndCapture is TestCrash for authorize now,
// capture later: clients authorize charges and capture them (in whole or in
// part) or void them a few operations later, each client keeping up to two
// authorizations waiting, while the process is SIGKILLed, each time with a
// capture or void in flight and authorizations waiting for theirs, and
// restarted. Every unanswered request is retried with its key and body until
// it is answered. A few authorizations, made first, are left to expire during
// the run (CHARGE_AUTHORIZATION_TTL), swept by the processes being killed.
// Afterwards: every capture and void was answered 200 once (or 409 naming the
// expiry that overtook it), every answer replays byte for byte, and the audit
// finds each authorization settled at most once with one event per step, the
// balances, the holds and the events in JetStream adding up.
func TestCrashBetweenAuthorizationAndCapture(t *testing.T) {
	var (
		auths    = scale(200, 3000)
		workers  = scale(8, 16)
		kills    = scale(3, 30)
		nAcct    = scale(4, 12)
		expiring = scale(8, 40)
		ttl      = scale(15*time.Second, 30*time.Second)
	)
	s := startScenario(t, scale(90*time.Second, 15*time.Minute), testDatabase, "crash-capture")
	ctx, bin, m, record := s.ctx, s.bin, s.merchants[0], s.record
	natsURL := testkit.StartNATS(t).URL()
	svc := newService(t, bin, serviceConfig{databaseURL: s.dbURL, natsURL: natsURL,
		extra: []string{"CHARGE_AUTHORIZATION_TTL=" + ttl.String(), "CHARGE_EXPIRY_INTERVAL=1s"}})
	c := newClient(t, m.APIKey, "crashcap-key-", func(int) string { return svc.url() })

	// Funds for every authorization, so that few fail for funds; then the
	// authorizations left to expire.
	var accounts []string
	perAccount := int64(auths+expiring) * 250 * 11 / 10 / int64(nAcct)
	for range nAcct {
		acct := c.mustAccount(t, ctx, usd)
		accounts = append(accounts, acct)
		record(mustDrive(t, ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
			amount: perAccount, body: []byte(`{"amount":` + itoa(perAccount) + `}`)}, http.StatusCreated))
	}
	for i := range expiring {
		acct := accounts[i%nAcct]
		record(mustDrive(t, ctx, c, op{kind: "authorize", path: "/v1/charges", account: acct, amount: 50,
			body: authorizeBody(acct, 50)}, http.StatusCreated))
	}

	var (
		done     atomic.Int64 // authorizations answered
		inFlight atomic.Int64 // captures and voids sent and not yet answered
		waiting  atomic.Int64 // authorizations answered 201 whose capture or void is not yet answered
	)
	k := startCrashKiller(ctx, svc, kills, auths, &done, &inFlight, &waiting)

	var (
		next       atomic.Int64
		unresolved atomic.Int64
		lostToKill atomic.Int64 // captures and voids committed whose answer a kill lost: replayed on retry
		wg         sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			var queue []op // authorizations waiting for their capture or void
			settleFirst := func() {
				o := settlement(queue[0])
				queue = queue[1:]
				inFlight.Add(1)
				o = drive(ctx, c, o)
				inFlight.Add(-1)
				waiting.Add(-1)
				record(o)
				if o.answer.status == 0 {
					unresolved.Add(1)
				}
				if o.answer.replayed() {
					lostToKill.Add(1)
				}
			}
			for next.Add(1) <= int64(auths) && ctx.Err() == nil {
				acct := accounts[rand.IntN(len(accounts))]
				amount := 1 + rand.Int64N(500)
				o := drive(ctx, c, op{kind: "authorize", path: "/v1/charges", account: acct, amount: amount,
					body: authorizeBody(acct, amount)})
				record(o)
				done.Add(1)
				switch o.answer.status {
				case 0:
					unresolved.Add(1)
				case http.StatusCreated:
					waiting.Add(1)
					queue = append(queue, o)
				}
				for len(queue) > rand.IntN(3) {
					settleFirst()
				}
			}
			for len(queue) > 0 && ctx.Err() == nil {
				settleFirst()
			}
		})
	}
	wg.Wait()
	if err := k.wait(); err != nil {
		t.Fatalf("killer: %v", err)
	}
	requestsInRun, replaysInRun := c.stats.requests.Load(), c.stats.replayed.Load()

	// The authorizations left alone expire, and the sweep records it.
	awaitNoHolds(t, ctx, s, ttl+scale(30*time.Second, time.Minute))
	unexpected, overtaken, captured, voided := judgeSettlements(t, ctx, c, s.recorded())
	var noAvailable int
	for _, acct := range accounts {
		noAvailable += checkAvailable(t, ctx, c, acct)
	}

	end := s.judge(t, svc, natsURL, c)
	a := end.audit
	var mismatch int
	if a.captured != captured || a.voided != voided || a.expired != expiring+overtaken {
		mismatch++
		t.Errorf("the database holds %d captured, %d voided, %d expired authorizations; the clients were answered %d captures, %d voids, "+
			"and %d were left to expire, %d overtaken by expiry", a.captured, a.voided, a.expired, captured, voided, expiring, overtaken)
	}
	if k.withSettlement == 0 || k.waitingAtKills == 0 {
		mismatch++
		t.Errorf("no kill struck with a capture or void in flight (%d) or an authorization waiting for one (%d)", k.withSettlement, k.waitingAtKills)
	}
	st := c.stats
	t.Logf("%d operations (%d authorizations, %d failed for funds; %d captured, %d voided, %d expired of which %d overtook a capture or void), "+
		"%d requests before the replay pass: %d network errors, %d 503, %d 409 in-use, %d replays (%d of captures or voids); "+
		"%d kills (%d with a capture or void in flight, %d in flight and %d authorizations waiting for one in all), %d starts; %d events in the stream twice",
		len(s.recorded()), a.authorizations, a.failed, a.captured, a.voided, a.expired, overtaken,
		requestsInRun, st.netErrors.Load(), st.unavailable.Load(), st.inUse.Load(), replaysInRun, lostToKill.Load(),
		kills, k.withSettlement, k.inFlightAtKills, k.waitingAtKills, svc.starts, end.republished)

	summary{
		scenario: "crash between authorization and capture (SIGKILL with captures in flight)",
		requests: st.requests.Load(),
		faults: itoa(int64(kills)) + " SIGKILLs of `payments serve` (relay and expiry sweep inside), " +
			itoa(k.withSettlement) + " with captures or voids in flight, " + itoa(k.waitingAtKills) + " authorizations waiting for one at the kills",
		duplicates: a.duplicateCharges + a.settledTwice,
		lost:       end.lost(),
		violations: end.violations() + unexpected + mismatch + noAvailable + int(unresolved.Load()),
		command:    reproduce("TestCrashBetweenAuthorizationAndCapture"),
	}.log(t, time.Since(s.began))
}

// settlement is what follows an authorization: half the time a capture of
// all of it, a quarter of part of it, a quarter a void.
func settlement(auth op) op {
	id := auth.answer.field("id")
	switch n := rand.IntN(4); {
	case n < 2:
		return captureOp(id, auth.account, 0)
	case n == 2:
		return captureOp(id, auth.account, 1+rand.Int64N(auth.amount))
	default:
		return voidOp(id, auth.account)
	}
}

// mustDrive drives o to a definite answer and fails t unless it is want.
func mustDrive(t *testing.T, ctx context.Context, c *client, o op, want int) op {
	t.Helper()
	o = drive(ctx, c, o)
	if o.answer.status != want {
		t.Fatalf("%s %s: %d %s, want %d", o.kind, o.path, o.answer.status, o.answer.body, want)
	}
	return o
}

// crashKiller SIGKILLs and restarts a service as authorizations complete,
// each time once a capture or void is in flight (waiting up to 5 s for one).
type crashKiller struct {
	err                                             chan error
	withSettlement, inFlightAtKills, waitingAtKills int64 // read after wait
}

func startCrashKiller(ctx context.Context, svc *service, kills, auths int, done, inFlight, waiting *atomic.Int64) *crashKiller {
	k := &crashKiller{err: make(chan error, 1)}
	go func() {
		k.err <- func() error {
			step := auths / (kills + 1)
			for i := range kills {
				at := int64((i+1)*step + rand.IntN(step) - step/2)
				for done.Load() < at {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					time.Sleep(2 * time.Millisecond)
				}
				time.Sleep(rand.N(10 * time.Millisecond)) // mid-request, not between them
				for deadline := time.Now().Add(5 * time.Second); inFlight.Load() == 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				n, w := inFlight.Load(), waiting.Load()
				if n > 0 {
					k.withSettlement++
				}
				k.inFlightAtKills += n
				k.waitingAtKills += w
				if err := svc.restart(); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	return k
}

// wait returns once the killer is done, with its error.
func (k *crashKiller) wait() error { return <-k.err }

// awaitNoHolds waits until no charge of the scenario is still authorized: every
// one captured, voided, or expired and swept. It fails t after bound.
func awaitNoHolds(t *testing.T, ctx context.Context, s *scenario, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		var left int
		must(t, s.db.QueryRow(ctx, `SELECT count(*) FROM charges WHERE status = 'authorized'`).Scan(&left), "count holds")
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d authorizations still not captured, voided or swept %v after the clients finished", left, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// judgeSettlements checks every answer the clients got: a deposit 201, an
// authorization 201 or 402, a capture or void 200 with the status it asked
// for (and a capture's amount), or 409 naming an expiry that came first; and
// asking again with the same key and body returns it byte for byte, marked as
// a replay. It returns the unexpected and mismatched answers and the
// captures, voids and expiries answered.
func judgeSettlements(t *testing.T, ctx context.Context, c *client, ops []op) (unexpected, overtaken, captured, voided int) {
	t.Helper()
	for _, o := range ops {
		ch := chargeOf(o.answer)
		switch {
		case o.kind == "deposit" && o.answer.status == http.StatusCreated,
			o.kind == "authorize" && (o.answer.status == http.StatusCreated || o.answer.status == http.StatusPaymentRequired):
		case o.kind == "capture" && o.answer.status == http.StatusOK && ch.Status == "succeeded" &&
			(o.amount == 0 && ch.AmountCaptured == ch.Amount || o.amount > 0 && ch.AmountCaptured == o.amount):
			captured++
		case o.kind == "void" && o.answer.status == http.StatusOK && ch.Status == "voided":
			voided++
		case (o.kind == "capture" || o.kind == "void") && o.answer.status == http.StatusConflict &&
			o.answer.code() == "charge-not-"+map[string]string{"capture": "capturable", "void": "voidable"}[o.kind] &&
			o.answer.field("charge_status") == "expired":
			overtaken++
		default:
			unexpected++
			if o.answer.status != 0 {
				t.Errorf("%s %s: answered %d %s", o.kind, o.path, o.answer.status, o.answer.body)
			}
			continue
		}
		again, err := c.send(ctx, 1, http.MethodPost, o.path, o.key, o.body)
		if err != nil || again.status != o.answer.status || !bytes.Equal(again.body, o.answer.body) || !again.replayed() {
			unexpected++
			t.Errorf("%s %s again: %d %s (replayed %v, %v), first %d %s", o.kind, o.path,
				again.status, again.body, again.replayed(), err, o.answer.status, o.answer.body)
		}
	}
	return unexpected, overtaken, captured, voided
}
