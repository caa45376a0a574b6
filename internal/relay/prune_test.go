package relay_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/relay"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
)

// TestPruningGoesPastSparedEvents: the oldest events, more than a prune
// batch of them, are one merchant's, spared for its live endpoint whose
// deliveries stay pending; another merchant's aged events behind them are
// pruned in the relay's first round of pruning all the same, and the spared
// ones stay.
func TestPruningGoesPastSparedEvents(t *testing.T) {
	const batch = 2
	e := setup(t)
	ctx := context.Background()
	if _, err := e.store.CreateWebhookEndpoint(ctx, e.merchant, "http://127.0.0.1:1/hook", []string{payment.AllEvents}, "whsec_"+uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	acct := e.account(1000) // two events, then one per charge
	for range 4 {
		e.charge(acct, 1)
	}
	if r, err := e.store.FanOut(ctx, 100); err != nil || r.Created != 6 {
		t.Fatalf("FanOut = %+v, %v; want 6 created", r, err)
	}
	globex, _, err := e.store.RegisterMerchant(ctx, "globex")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		webhooktest.AddEvent(t, e.store.Pool(), globex, payment.EventChargeSucceeded)
	}
	if _, err := e.store.Pool().Exec(ctx, `UPDATE events SET created_at = now() - interval '31 days'`); err != nil {
		t.Fatal(err)
	}

	r, _ := e.startRelay(func(r *relay.Relay) { r.SetPruneBatch(batch) })
	left := func(merchant uuid.UUID) int {
		var n int
		if err := e.store.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE merchant_id = $1`, merchant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	e.waitUntil("globex's aged events are pruned", func() bool { return left(globex) == 0 })
	if n, pruned := left(e.merchant), r.Stats.Pruned.Load(); n != 6 || pruned != 3 {
		t.Errorf("%d events of the merchant with the endpoint left, %d pruned; want all 6 left, globex's 3 pruned", n, pruned)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`); n != 6 {
		t.Errorf("%d deliveries pending, want 6", n)
	}
}
