package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/webhook"
)

// BenchmarkWebhookDelivery measures, on PostgreSQL and a receiver on a
// loopback port that answers 204 at once, with a Deliverer as serve runs it
// (its defaults: woken by the store's commits, 1 s poll, up to 32 in flight per
// endpoint, 64 per merchant, 256 in all):
//
//   - deliveries/s: b.N events committed before the Deliverer starts, until
//     every one was acknowledged by one endpoint;
//
//   - the delay from a charge's commit (its answer returned by the charge
//     path, which then wakes the Deliverer as in serve) to its
//     charge.succeeded event's arrival (p50, p99 ms), with charges made one
//     by one at a steady rate (rate/s) for 5 s.
//
//     go test -run '^$' -bench WebhookDelivery -benchtime 2000x ./internal/webhook/
func BenchmarkWebhookDelivery(b *testing.B) {
	s := setup(b)
	var (
		mu      sync.Mutex
		arrived = map[string]time.Time{}
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if _, seen := arrived[r.Header.Get(webhook.EventIDHeader)]; !seen {
			arrived[r.Header.Get(webhook.EventIDHeader)] = time.Now()
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(receiver.Close)
	endpoint(b, s.store, s.merchant, receiver.URL, "*")
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(arrived) }
	wait := func(n int) {
		for deadline := time.Now().Add(5 * time.Minute); count() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d events delivered after 5 minutes", count(), n)
			}
		}
	}
	// Throughput: b.N events at once.
	if _, err := s.store.Pool().Exec(context.Background(), `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
SELECT $1, gen_random_uuid(), 'account', gen_random_uuid(), 'account.created', '{"amount":100}'
FROM generate_series(1, $2)`, s.merchant, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	d := webhook.NewDeliverer(s.store, slog.New(slog.DiscardHandler), webhook.Options{AllowPrivate: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	wait(b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")

	// Delay: one charge at a time, at a steady rate.
	const rate, seconds = 200, 5
	committed := chargeSteadily(b, s, rate, rate*seconds)
	wait(b.N + rate*seconds)
	var delays []float64
	mu.Lock()
	for id, at := range committed {
		delays = append(delays, float64(arrived[id].Sub(at).Microseconds())/1000)
	}
	mu.Unlock()
	slices.Sort(delays)
	b.ReportMetric(delays[len(delays)/2], "p50-delay-ms")
	b.ReportMetric(delays[len(delays)*99/100], "p99-delay-ms")
	b.ReportMetric(rate, "rate/s")
}

// chargeSteadily makes n charges of s's merchant through the charge path,
// one every 1/rate s, and returns when each was answered, by the id of its
// charge.succeeded event.
func chargeSteadily(b *testing.B, s bundle, rate, n int) map[string]time.Time {
	ctx := context.Background()
	account := payment.NewID()
	if _, err := s.store.Pool().Exec(ctx, `
INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, 'USD', 1000000000)`, s.merchant, account); err != nil {
		b.Fatal(err)
	}
	path := testkit.NewService(s.store, postgres.Options{}, charging.Options{})
	answered := map[string]time.Time{} // by the charge's id
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		r, err := path.CreateCharge(ctx, chargedb.KeyedCharge{
			Request: idempotency.Request{MerchantID: s.merchant, Key: fmt.Sprint("delay-", i)},
			Charge:  payment.NewCharge{AccountID: account, Amount: 1, Currency: "USD"},
			Render:  testkit.RenderCharge,
		})
		at := time.Now()
		var c struct{ ID string }
		if err != nil || r.Status != http.StatusCreated || json.Unmarshal(r.Body, &c) != nil {
			b.Fatalf("charge %d: %d %s, %v", i, r.Status, r.Body, err)
		}
		answered[c.ID] = at
	}
	rows, _ := s.store.Pool().Query(ctx, `
SELECT aggregate_id, id FROM events WHERE merchant_id = $1 AND type = 'charge.succeeded'`, s.merchant)
	byEvent := map[string]time.Time{}
	var charge, event uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&charge, &event}, func() error {
		byEvent[payment.FormatID(payment.PrefixEvent, event)] = answered[payment.FormatID(payment.PrefixCharge, charge)]
		return nil
	}); err != nil || len(byEvent) != n {
		b.Fatalf("%d charge.succeeded events of %d charges: %v", len(byEvent), n, err)
	}
	return byEvent
}
