package chaos_test

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// TestCrash charges through SIGKILLs: clients fire charges (with a few
// deposits and refunds among them) at "payments serve" and retry every failed
// or timed-out request with the same key and body until it is answered 201 or
// 402, while the process is killed with SIGKILL at random moments and
// restarted. Afterwards every answer is replayed byte for byte, the relay has
// published every event to JetStream, and the database holds exactly one
// charge per key, a key for every object, an event for every object, and
// balances that add up.
func TestCrash(t *testing.T) {
	var (
		charges = scale(300, 5000)
		workers = scale(8, 16)
		kills   = scale(3, 30)
		nAcct   = scale(6, 20)
	)
	s := startScenario(t, scale(90*time.Second, 15*time.Minute), testDatabase, "crash")
	ctx, bin, m, record := s.ctx, s.bin, s.merchants[0], s.record
	natsURL := testkit.StartNATS(t).URL()
	svc := newService(t, bin, serviceConfig{databaseURL: s.dbURL, natsURL: natsURL})
	c := newClient(t, m.APIKey, "crash-key-", func(int) string { return svc.url() })

	// Accounts funded for about 70% of what will be charged, so that the last
	// charges on each account fail with 402 and record failed charges.
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
		record(o)
	}

	// The killer: SIGKILL when the clients have completed a random share of
	// the charges around each of kills evenly spaced points, then restart.
	var done atomic.Int64
	killerErr := make(chan error, 1)
	go func() {
		killerErr <- func() error {
			for i := range kills {
				step := charges / (kills + 1)
				at := int64((i+1)*step + rand.IntN(step) - step/2)
				for done.Load() < at {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					time.Sleep(2 * time.Millisecond)
				}
				time.Sleep(rand.N(20 * time.Millisecond)) // mid-request, not between them
				if err := svc.restart(); err != nil {
					return err
				}
			}
			return nil
		}()
	}()

	// The clients.
	var (
		next       atomic.Int64
		unresolved atomic.Int64
		wg         sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(charges) && ctx.Err() == nil {
				acct := accounts[rand.IntN(len(accounts))]
				if rand.IntN(25) == 0 {
					o := drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
						amount: 1000, body: []byte(`{"amount":1000}`)})
					record(o)
				}
				amount := 1 + rand.Int64N(500)
				o := drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount,
					body: chargeBody(acct, amount)})
				record(o)
				done.Add(1)
				if o.answer.status == 0 {
					unresolved.Add(1)
					continue
				}
				if o.answer.status == http.StatusCreated && rand.IntN(8) == 0 {
					// Refund it, in full or in part.
					body, refund := []byte(`{}`), amount
					if rand.IntN(2) == 0 && amount > 1 {
						refund = amount / 2
						body = []byte(`{"amount":` + itoa(refund) + `}`)
					}
					r := drive(ctx, c, op{kind: "refund", path: "/v1/charges/" + o.answer.field("id") + "/refunds",
						account: acct, amount: refund, body: body})
					record(r)
				}
			}
		}()
	}
	wg.Wait()
	if err := <-killerErr; err != nil {
		t.Fatalf("killer: %v", err)
	}
	chargeRequests, replaysInRun := c.stats.requests.Load(), c.stats.replayed.Load()

	// Every definite answer was 201 or 402 (a refund: 201), and asking again
	// now returns it byte for byte, marked as a replay.
	var unexpected, replayMismatch int
	for _, o := range s.recorded() {
		ok := o.answer.status == http.StatusCreated || (o.kind == "charge" && o.answer.status == http.StatusPaymentRequired)
		if !ok {
			unexpected++
			if o.answer.status != 0 {
				t.Errorf("%s %s: answered %d %s", o.kind, o.path, o.answer.status, o.answer.body)
			}
			continue
		}
		again, err := c.send(ctx, 1, http.MethodPost, o.path, o.key, o.body)
		if err != nil || again.status != o.answer.status || !bytes.Equal(again.body, o.answer.body) || !again.replayed() {
			replayMismatch++
			t.Errorf("%s %s again: %d %s (replayed %v, %v), first %d %s", o.kind, o.path,
				again.status, again.body, again.replayed(), err, o.answer.status, o.answer.body)
		}
	}

	// Every event reached JetStream: the relay ran inside each process and
	// was killed with it.
	end := s.judge(t, svc, natsURL, c)
	st := c.stats
	t.Logf("%d operations (%d charges, %d failed for funds), %d requests before the replay pass: %d network errors, "+
		"%d 503, %d 409 in-use, %d replays (answers lost to a kill after the commit); %d kills, %d starts; "+
		"%d events in the stream twice",
		len(s.recorded()), end.audit.charges, end.audit.failed, chargeRequests, st.netErrors.Load(), st.unavailable.Load(), st.inUse.Load(),
		replaysInRun, kills, svc.starts, end.republished)

	summary{
		scenario:   "crash (SIGKILL mid-traffic)",
		requests:   st.requests.Load(),
		faults:     itoa(int64(kills)) + " SIGKILLs of `payments serve` (relay inside)",
		duplicates: end.audit.duplicateCharges,
		lost:       end.lost(),
		violations: end.violations() + unexpected + replayMismatch + int(unresolved.Load()),
		command:    reproduce("TestCrash"),
	}.log(t, time.Since(s.began))
}
