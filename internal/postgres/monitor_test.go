package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// addDeliveries inserts n deliveries of fresh events to the endpoint, in
// state, next due at now() plus due (negative: overdue).
func addDeliveries(t testing.TB, s *Store, merchant, endpoint uuid.UUID, n int, state string, due time.Duration) {
	t.Helper()
	if _, err := s.Pool().Exec(context.Background(), `
INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, state, next_attempt_at)
SELECT $1, $2, gen_random_uuid(), $3, now() + $4::interval FROM generate_series(1, $5)`,
		merchant, endpoint, state, due, n); err != nil {
		t.Fatal(err)
	}
}

// storeAndMonitor opens a Store and a Monitor of a fresh database.
func storeAndMonitor(tb testing.TB) (*Store, *Monitor) {
	tb.Helper()
	url := pgtest.NewDatabase(tb)
	mon, err := OpenMonitor(context.Background(), url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(mon.Close)
	return openStore(tb, url), mon
}

// TestMonitorDeliveries: the monitor counts the pending deliveries of live
// enabled endpoints whose attempt is due, and how long the most overdue has
// waited since it came due; retries scheduled later, settled deliveries,
// and those of deleted or disabled endpoints do not count. Past
// DueCountBound the count stops at the bound, and the overdue time stays
// exact.
func TestMonitorDeliveries(t *testing.T) {
	ctx := context.Background()
	s, mon := storeAndMonitor(t)
	read := func() DeliveryState {
		t.Helper()
		st, err := mon.Deliveries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	if st := read(); st != (DeliveryState{}) {
		t.Errorf("without deliveries: %+v, want none due", st)
	}
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	live, deleted, disabled := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, acme, payment.AllEvents),
		addEndpoint(t, s, globex, payment.AllEvents)
	addDeliveries(t, s, acme, live, 2, "pending", -5*time.Minute)
	addDeliveries(t, s, acme, live, 1, "pending", -time.Second)
	addDeliveries(t, s, acme, live, 4, "pending", time.Hour) // failed, waiting out their backoff
	addDeliveries(t, s, acme, live, 3, "delivered", -time.Hour)
	addDeliveries(t, s, acme, live, 3, "abandoned", -time.Hour)
	addDeliveries(t, s, acme, deleted, 5, "pending", -2*time.Hour)
	addDeliveries(t, s, globex, disabled, 5, "pending", -2*time.Hour)
	if err := s.DeleteWebhookEndpoint(ctx, acme, deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE webhook_endpoints SET status = 'disabled' WHERE id = $1`, disabled); err != nil {
		t.Fatal(err)
	}
	st := read()
	if st.Due != 3 || st.Overdue < 5*time.Minute || st.Overdue > 5*time.Minute+time.Minute {
		t.Errorf("3 due on a live endpoint, the oldest 5 minutes overdue: read %d due, %v overdue", st.Due, st.Overdue)
	}

	addDeliveries(t, s, globex, addEndpoint(t, s, globex, payment.AllEvents), DueCountBound, "pending", -time.Minute)
	st = read()
	if st.Due != DueCountBound || st.Overdue < 5*time.Minute || st.Overdue > 5*time.Minute+time.Minute {
		t.Errorf("%d due: read %d due, %v overdue; want the bound, %d, and 5 minutes", DueCountBound+3, st.Due, st.Overdue, DueCountBound)
	}
}

// BenchmarkMonitorDeliveries is one sample of the due deliveries with
// 100,000 pending deliveries on 100 endpoints of 10 merchants, of which
// 10,000 (the bound) are due and 90,000 are retries scheduled later: the
// gauges' cost, every METRICS_SAMPLE on every replica.
//
//	go test -run '^$' -bench MonitorDeliveries ./internal/postgres/
func BenchmarkMonitorDeliveries(b *testing.B) {
	ctx := context.Background()
	s, mon := storeAndMonitor(b)
	for range 10 {
		merchant := newMerchant(b, s, "m-"+uuid.NewString()[:8])
		for i := range 10 {
			endpoint := addEndpoint(b, s, merchant, payment.AllEvents)
			addDeliveries(b, s, merchant, endpoint, 900, "pending", time.Hour)
			if i == 0 {
				addDeliveries(b, s, merchant, endpoint, 1000, "pending", -time.Minute)
			}
		}
	}
	if _, err := s.Pool().Exec(ctx, `VACUUM ANALYZE webhook_deliveries`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if st, err := mon.Deliveries(ctx); err != nil || st.Due != DueCountBound {
			b.Fatalf("%+v, %v", st, err)
		}
	}
}
