package chaos_test

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

// TestWebhookReceiverDownThenBack is a receiver's outage: a merchant's
// two webhook endpoints are down while it charges, one refusing connections
// (nothing listens on its port) and one answering 503, for 30 s (10 s in
// the short version); then both come back. With the Deliverer's default
// backoff (first retry within 10 s, full jitter, doubling) each gets every
// event it missed, signed with its secret, and webhook_attempts shows the
// failures: errors for the first, 503s for the second.
func TestWebhookReceiverDownThenBack(t *testing.T) {
	downFor := scale(10*time.Second, 30*time.Second)
	s := startScenario(t, scale(2*time.Minute, 10*time.Minute), testDatabase, "webhooks-down")
	ctx, m := s.ctx, s.merchants[0]
	svc := newService(t, s.bin, serviceConfig{databaseURL: s.dbURL, extra: []string{"WEBHOOK_ALLOW_PRIVATE_NETWORKS=true"}})
	c := newClient(t, m.APIKey, "hookdown-key-", func(int) string { return svc.url() })

	refusing, failing := &hookReceiver{}, &hookReceiver{}
	failing.status.Store(http.StatusServiceUnavailable)
	failingSrv := failing.listen(t, "127.0.0.1:0")
	refusingAddr := freeAddr(t) // nobody listens there until it comes back
	endpoints := []hookEndpoint{
		mustEndpoint(t, ctx, c, m, refusing, "http://"+refusingAddr, "/hook", "*"),
		mustEndpoint(t, ctx, c, m, failing, failingSrv.URL, "/hook", "*"),
	}

	// Events all through the outage: an account, its deposit, then charges.
	acct := c.mustAccount(t, ctx, usd)
	s.record(drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
		amount: 1_000_000, body: []byte(`{"amount":1000000}`)}))
	for end := s.began.Add(downFor); time.Now().Before(end) && ctx.Err() == nil; {
		amount := 1 + rand.Int64N(500)
		s.record(drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount)}))
		time.Sleep(200 * time.Millisecond)
	}
	// The outage is over: both answer 204 from now on.
	duringOutage := len(failing.requests("/hook"))
	refusing.listen(t, refusingAddr)
	failing.status.Store(0)
	back := time.Now()

	awaitDeliveries(t, ctx, s.db, scale(90*time.Second, 8*time.Minute))
	caughtUp := time.Since(back)
	svc.stop()
	v := judgeHooks(t, ctx, s.db, endpoints)
	refusedErrors, _ := failedAttempts(t, ctx, s.db, endpoints[0])
	_, answered503 := failedAttempts(t, ctx, s.db, endpoints[1])
	if refusedErrors == 0 || answered503 == 0 {
		t.Errorf("webhook_attempts shows %d errors for the refusing endpoint and %d non-2xx answers for the failing one; want both above 0",
			refusedErrors, answered503)
	}
	if v.unrecorded > 0 {
		t.Errorf("%d requests received without a recorded attempt, with no kill to cut them", v.unrecorded)
	}
	a := auditDatabase(t, ctx, s.db, m.ID)
	a.report(t)
	broken, gap := checkClientView(t, ctx, s.db, m.ID, s.recorded())
	t.Logf("%d events to each of 2 endpoints down %v; recorded %d refused connections and %d 503s (%d requests reached the failing one while down); "+
		"every event delivered %v after they came back; %d requests received in all, %d duplicates",
		v.events/2, downFor, refusedErrors, answered503, duringOutage, caughtUp.Round(100*time.Millisecond), v.received, v.duplicates)

	summary{
		scenario: "webhook receiver down, then back (refusing connections; answering 503)",
		requests: c.stats.requests.Load(),
		faults: "2 endpoints down " + downFor.String() + " (one refusing connections, one answering 503) while " +
			itoa(int64(v.events/2)) + " events were made; " + itoa(int64(v.failures)) + " failed attempts recorded; all delivered " +
			caughtUp.Round(time.Second).String() + " after",
		duplicates: a.duplicateCharges,
		lost:       v.lost + int(gap) + a.missingEvents,
		violations: v.violations() + a.violations() + broken,
		command:    reproduce("TestWebhookReceiverDownThenBack"),
	}.log(t, time.Since(s.began))
}
