package chaos_test

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWebhooksSurviveCrashes kills the Deliverer with deliveries in flight: a
// merchant has two webhook endpoints on a local receiver, one subscribed to
// every event and one to charge.succeeded, and another merchant one of its
// own on the same receiver; clients charge and deposit while "payments
// serve" is SIGKILLed, each time while the receiver is holding a delivery
// request, and restarted. Once every delivery is settled, every event each
// endpoint subscribes to reached it at least once, signed with its secret,
// and no other event did; every attempt recorded with a status was received,
// and every delivery marked delivered has a recorded 2xx attempt. The
// charges themselves are audited as in TestCrash.
func TestWebhooksSurviveCrashes(t *testing.T) {
	var (
		charges = scale(200, 3000)
		workers = scale(6, 16)
		kills   = scale(3, 20)
		nAcct   = scale(4, 12)
	)
	s := startScenario(t, scale(2*time.Minute, 15*time.Minute), testDatabase, "webhooks", "webhooks-other")
	ctx, m, other := s.ctx, s.merchants[0], s.merchants[1]
	svc := newService(t, s.bin, serviceConfig{databaseURL: s.dbURL, extra: []string{"WEBHOOK_ALLOW_PRIVATE_NETWORKS=true"}})
	c := newClient(t, m.APIKey, "hookcrash-key-", func(int) string { return svc.url() })
	oc := newClient(t, other.APIKey, "hookcrash-other-", func(int) string { return svc.url() })

	recv, endpoints := threeEndpoints(t, ctx, c, m, oc, other)

	// Accounts funded for about 70% of what will be charged, so the last
	// charges fail (charge.failed, which /charges does not subscribe to).
	var accounts []string
	perAccount := int64(charges) * 250 * 70 / 100 / int64(nAcct)
	for range nAcct {
		acct := c.mustAccount(t, ctx, usd)
		accounts = append(accounts, acct)
		o := drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
			amount: perAccount, body: []byte(`{"amount":` + itoa(perAccount) + `}`)})
		if o.answer.status != http.StatusCreated {
			t.Fatalf("opening deposit: %d %s", o.answer.status, o.answer.body)
		}
		s.record(o)
	}
	otherAcct := oc.mustAccount(t, ctx, usd)
	oc.mustDeposit(t, ctx, otherAcct, 1_000_000)

	// The killer: around each of kills evenly spaced points of the charges,
	// wait until the receiver holds a request, then SIGKILL and restart. A
	// kill leaves its claimed deliveries leased for 15 s, and they count
	// against their endpoint's bound: the wait may be that long.
	var done, heldAtKill atomic.Int64
	killerErr := make(chan error, 1)
	go func() {
		killerErr <- func() error {
			step := charges / (kills + 1)
			for i := range kills {
				at := int64((i+1)*step + rand.IntN(step) - step/2)
				for done.Load() < at && ctx.Err() == nil {
					time.Sleep(2 * time.Millisecond)
				}
				for wait := time.Now().Add(20 * time.Second); recv.inFlight.Load() == 0 && time.Now().Before(wait); {
					time.Sleep(time.Millisecond)
				}
				if recv.inFlight.Load() > 0 {
					heldAtKill.Add(1)
				}
				if err := svc.restart(); err != nil {
					return err
				}
			}
			return ctx.Err()
		}()
	}()

	var (
		next       atomic.Int64
		unresolved atomic.Int64
		wg         sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(charges) && ctx.Err() == nil {
				cl, acct := c, accounts[rand.IntN(len(accounts))]
				if w == 0 && rand.IntN(4) == 0 {
					cl, acct = oc, otherAcct // the other merchant's events, in flight beside ours
				} else if rand.IntN(20) == 0 {
					s.record(drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
						amount: 1000, body: []byte(`{"amount":1000}`)}))
				}
				amount := 1 + rand.Int64N(500)
				o := drive(ctx, cl, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount)})
				if cl == c {
					s.record(o)
				}
				done.Add(1)
				if o.answer.status == 0 {
					unresolved.Add(1)
				}
				// Paced, so the endpoints keep up and have few deliveries in
				// flight: a kill then stalls only those (for their lease), and
				// the kills fall while the clients charge.
				time.Sleep(rand.N(400 * time.Millisecond))
			}
		}()
	}
	wg.Wait()
	if err := <-killerErr; err != nil {
		t.Fatalf("killer: %v", err)
	}

	drainStart := time.Now()
	awaitDeliveries(t, ctx, s.db, scale(time.Minute, 5*time.Minute))
	drain := time.Since(drainStart)
	svc.stop()
	v := judgeHooks(t, ctx, s.db, endpoints)
	if v.unrecorded > kills*deliveriesInFlight {
		t.Errorf("%d requests received without a recorded attempt: more than the %d kills can cut (%d in flight each)", v.unrecorded, kills, deliveriesInFlight)
	}
	a := auditDatabase(t, ctx, s.db, m.ID)
	a.report(t)
	broken, gap := checkClientView(t, ctx, s.db, m.ID, s.recorded())
	t.Logf("%d events to deliver to 3 endpoints, %d requests received: %d duplicates, %d cut by a kill before their attempt was recorded; "+
		"%d kills (%d with a delivery request held), %d starts; settled %v after the last restart; %d charge requests (%d unresolved)",
		v.events, v.received, v.duplicates, v.unrecorded, kills, heldAtKill.Load(), svc.starts,
		drain.Round(100*time.Millisecond), c.stats.requests.Load()+oc.stats.requests.Load(), unresolved.Load())

	summary{
		scenario: "webhooks through crashes (SIGKILL with deliveries in flight)",
		requests: c.stats.requests.Load() + oc.stats.requests.Load(),
		faults: itoa(int64(kills)) + " SIGKILLs of `payments serve` (Deliverer inside), " + itoa(heldAtKill.Load()) +
			" with a delivery request held; " + itoa(int64(v.events)) + " deliveries to 3 endpoints, " +
			itoa(int64(v.duplicates)) + " sent twice",
		duplicates: a.duplicateCharges,
		lost:       v.lost + int(gap) + a.missingEvents,
		violations: v.violations() + a.violations() + broken + int(unresolved.Load()),
		command:    reproduce("TestWebhooksSurviveCrashes"),
	}.log(t, time.Since(s.began))
}
