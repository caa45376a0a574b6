package webhook_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/webhook"
)

// BenchmarkWebhookDelivery measures, on PostgreSQL and a receiver on a
// loopback port that answers 204 at once, with a Deliverer as serve runs it
// (its defaults: 1 s poll, 4 in flight per endpoint, 32 in all):
//
//   - deliveries/s: b.N events committed at once, until every one was
//     acknowledged by one endpoint;
//
//   - the delay from an event's commit to its arrival (p50, p99 ms), with
//     events committed one by one at a steady rate (rate/s) for 5 s.
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
	d := webhook.NewDeliverer(s.store, slog.New(slog.DiscardHandler), webhook.Options{AllowPrivate: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })

	// Throughput: b.N events at once.
	if _, err := s.store.Pool().Exec(context.Background(), `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
SELECT $1, gen_random_uuid(), 'account', gen_random_uuid(), 'account.created', '{"amount":100}'
FROM generate_series(1, $2)`, s.merchant, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	wait(b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")

	// Delay: one event at a time, at a steady rate.
	const rate, seconds = 200, 5
	committed := map[string]time.Time{}
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for range rate * seconds {
		<-tick.C
		id := payment.NewID()
		if _, err := s.store.Pool().Exec(context.Background(), `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES ($1, $2, 'account', $2, 'account.created', '{"amount":100}')`, s.merchant, id); err != nil {
			b.Fatal(err)
		}
		committed[payment.FormatID(payment.PrefixEvent, id)] = time.Now()
	}
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
