package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments/internal/consumer"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/relay"
)

// serveMetrics serves m at /metrics, and liveness at /healthz, on their own
// listener at addr (METRICS_ADDR), never on the API's: what a scrape shows is
// for operators. Every long-running command (serve, relay, consume) has one,
// unless METRICS_ADDR is off (addr ""); it is logged with the command's name.
// m gets payments_build_info first. It returns a function that stops it.
func serveMetrics(command, addr string, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	if addr == "" { // METRICS_ADDR=off
		return func() {}, nil
	}
	b := currentBuild()
	m.BuildInfo(b.Version, b.Commit, b.GoVersion)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	})
	return serveAside("METRICS_ADDR", addr, mux, log, "metrics listening", "command", command)
}

// serveAside serves h on a listener of its own at addr, the value of the
// variable named setting, and logs msg with the address it got and attrs. It
// returns a function that stops it.
func serveAside(setting, addr string, h http.Handler, log *slog.Logger, msg string, attrs ...any) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s: %w", setting, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: maxHeaderBytes}
	go func() { _ = srv.Serve(ln) }()
	log.Info(msg, append([]any{"addr", ln.Addr().String()}, attrs...)...)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// cacheMetrics registers the gauges of serve's replay cache, front's, and of
// the bounds cfg sets on it.
func cacheMetrics(m *metrics.Metrics, front *idempotency.Front, cfg config) {
	m.CounterFunc("payments_idempotency_cache_hits_total", "Replays answered from the in-memory cache.",
		func() float64 { h, _ := front.Cache().Stats(); return float64(h) })
	m.GaugeFunc("payments_idempotency_cache_entries", "Completed responses held in the cache.",
		func() float64 { return float64(front.Cache().Len()) })
	m.GaugeFunc("payments_idempotency_cache_bytes", "Bytes the cached responses are counted for (IDEMPOTENCY_CACHE_BYTES bounds them).",
		func() float64 { return float64(front.Cache().Bytes()) })
	m.GaugeFunc("payments_idempotency_cache_max_bytes", "The cache's byte bound, IDEMPOTENCY_CACHE_BYTES.",
		func() float64 { return float64(cfg.Keys.CacheBytes) })
	m.GaugeFunc("payments_idempotency_cache_max_entries", "The cache's bound (IDEMPOTENCY_CACHE_SIZE).",
		func() float64 { return float64(cfg.Keys.CacheSize) })
	m.GaugeFunc("payments_idempotency_keys_in_flight", "Keys executing in this process (coalescing leaders).",
		func() float64 { return float64(front.InFlight()) })
}

// janitorMetrics registers what this process's janitor has done.
func janitorMetrics(m *metrics.Metrics, janitor *idempotency.Janitor) {
	m.CounterFunc("payments_janitor_deleted_keys_total", "Expired idempotency keys deleted by this process's janitor.",
		func() float64 { return float64(janitor.Deleted()) })
	m.GaugeFunc("payments_janitor_caught_up_timestamp_seconds", "When this process's janitor last left no expired key (0: never; a janitor standing aside for another never does).",
		func() float64 {
			if at := janitor.CaughtUp(); !at.IsZero() {
				return float64(at.Unix())
			}
			return 0
		})
}

// relayMetrics registers the counters of a relay (serve's or payments relay's)
// and whether it leads.
func relayMetrics(m *metrics.Metrics, r *relay.Relay) {
	m.CounterFunc("payments_relay_published_total", "Events the broker stored.", func() float64 { return float64(r.Stats.Published.Load()) })
	m.CounterFunc("payments_relay_duplicates_total", "Republished events the broker recognised.", func() float64 { return float64(r.Stats.Duplicates.Load()) })
	m.CounterFunc("payments_relay_pruned_total", "Published events pruned after the retention.", func() float64 { return float64(r.Stats.Pruned.Load()) })
	m.GaugeFunc("payments_relay_leader", "1 while this process's relay leads.", func() float64 {
		if r.Stats.Leader.Load() {
			return 1
		}
		return 0
	})
}

// consumerMetrics registers what the consumer has applied and what failed.
func consumerMetrics(m *metrics.Metrics, c *consumer.Consumer) {
	load := func(n *atomic.Int64) func() float64 { return func() float64 { return float64(n.Load()) } }
	m.CounterFunc("payments_consumer_applied_total", "Events applied to the balance projection for the first time.", load(&c.Stats.Applied))
	m.CounterFunc("payments_consumer_redelivered_total", "Events already applied (found in the inbox), acknowledged again.", load(&c.Stats.Redelivery))
	m.LabeledCounterFunc("payments_consumer_failures_total",
		"Consumer failures by reason: receive, apply (the event is redelivered), unreadable (terminated), ack (redelivered and skipped).",
		"reason", map[string]func() float64{
			"receive": load(&c.Stats.ReceiveErrors), "apply": load(&c.Stats.ApplyErrors),
			"unreadable": load(&c.Stats.Unreadable), "ack": load(&c.Stats.AckErrors),
		})
}

// webhookLag registers the webhook delivery-lag histogram on m and returns
// the Deliverer's OnDelivered, which observes it: from the created_at of the
// event the delivery carries (the database's clock) to the answer (this
// process's clock).
func webhookLag(m *metrics.Metrics) func(payment.WebhookDelivery, time.Time) {
	lag := m.WebhookLag()
	return func(d payment.WebhookDelivery, answered time.Time) {
		if !d.EventCreatedAt.IsZero() {
			lag.Delivered(answered.Sub(d.EventCreatedAt), d.Attempt)
		}
	}
}
