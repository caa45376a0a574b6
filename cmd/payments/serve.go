package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"payments"
	"payments/internal/httpapi"
	"payments/internal/idempotency"
	"payments/internal/metrics"
	"payments/internal/postgres"
)

// maxHeaderBytes bounds a request's headers; net/http answers 431 past it.
const maxHeaderBytes = 16 << 10

// serve runs the HTTP API until ctx is cancelled, then drains in-flight
// requests for up to ShutdownTimeout.
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	m := metrics.New()
	cfg, log, store, err := open(ctx, "serve", args, getenv, stderr, m)
	if err != nil {
		return err
	}
	defer store.Close()
	m.Pool(store.Pool())
	m.ChargeBatcher(store.ChargeStats, store.StuckAfter())
	front := idempotency.NewFront(cfg.CacheSize, cfg.CacheBytes, cfg.IdempotencyTTL, cfg.IdempotencyWait)
	m.CounterFunc("payments_idempotency_cache_hits_total", "Replays answered from the in-memory cache.",
		func() float64 { h, _ := front.Cache().Stats(); return float64(h) })
	m.GaugeFunc("payments_idempotency_cache_entries", "Completed responses held in the cache.",
		func() float64 { return float64(front.Cache().Len()) })
	m.GaugeFunc("payments_idempotency_cache_bytes", "Bytes the cached responses are counted for (IDEMPOTENCY_CACHE_BYTES bounds them).",
		func() float64 { return float64(front.Cache().Bytes()) })
	m.GaugeFunc("payments_idempotency_cache_max_bytes", "The cache's byte bound, IDEMPOTENCY_CACHE_BYTES.",
		func() float64 { return float64(cfg.CacheBytes) })
	m.GaugeFunc("payments_idempotency_cache_max_entries", "The cache's bound (IDEMPOTENCY_CACHE_SIZE).",
		func() float64 { return float64(cfg.CacheSize) })
	m.GaugeFunc("payments_idempotency_keys_in_flight", "Keys executing in this process (coalescing leaders).",
		func() float64 { return float64(front.InFlight()) })
	if err := store.Ping(ctx); err != nil {
		// Start anyway: /readyz reports the database, and requests answer 503
		// until it is back.
		log.Warn("database not reachable at start", "error", err)
	}

	api := httpapi.New(store, log, httpapi.Options{
		Spec:    payments.OpenAPI,
		Docs:    true,
		Front:   front,
		Metrics: m,
	})
	janitor := idempotency.NewJanitor(store, log, cfg.IdempotencyTTL, cfg.JanitorInterval, cfg.JanitorBatch, 10*time.Millisecond)
	m.CounterFunc("payments_janitor_deleted_keys_total", "Expired idempotency keys deleted by this process's janitor.",
		func() float64 { return float64(janitor.Deleted()) })
	m.GaugeFunc("payments_janitor_caught_up_timestamp_seconds", "When this process's janitor last left no expired key (0: never; a janitor standing aside for another never does).",
		func() float64 {
			if at := janitor.CaughtUp(); !at.IsZero() {
				return float64(at.Unix())
			}
			return 0
		})
	janitorCtx, stopJanitor := context.WithCancel(context.WithoutCancel(ctx))
	janitorDone := make(chan struct{})
	go func() { defer close(janitorDone); janitor.Run(janitorCtx) }()
	defer func() { stopJanitor(); <-janitorDone }()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	defer ln.Close() // in case serving never starts; Shutdown closes it too
	srv := &http.Server{
		Handler:           api,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("listening", "addr", ln.Addr().String())
	if cfg.MetricsAddr != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsAddr, m.Handler(), log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	// The outbox is sampled in the background on a connection of its own, for
	// the gauges and the warning about held events: a scrape does no database
	// work, and sampling takes no connection from payments.
	monitor, err := postgres.OpenMonitor(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	defer monitor.Close()
	sampler := m.Backlog(outboxSampler(monitor, cfg.EventsHeldWarn, log))
	samplerCtx, stopSampler := context.WithCancel(context.WithoutCancel(ctx))
	samplerDone := make(chan struct{})
	go func() { defer close(samplerDone); sampler.Run(samplerCtx, cfg.MetricsSample) }()
	defer func() { stopSampler(); <-samplerDone }()
	if cfg.PprofAddr != "" {
		stopPprof, err := servePprof(cfg.PprofAddr, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}

	if cfg.RelayEnabled {
		r, nc, err := newRelay(cfg, store, log)
		if err != nil {
			return err
		}
		defer nc.Close()
		m.CounterFunc("payments_relay_published_total", "Events the broker stored.", func() float64 { return float64(r.Stats.Published.Load()) })
		m.CounterFunc("payments_relay_duplicates_total", "Republished events the broker recognised.", func() float64 { return float64(r.Stats.Duplicates.Load()) })
		m.CounterFunc("payments_relay_pruned_total", "Published events pruned after the retention.", func() float64 { return float64(r.Stats.Pruned.Load()) })
		m.GaugeFunc("payments_relay_leader", "1 while this process's relay leads.", func() float64 {
			if r.Stats.Leader.Load() {
				return 1
			}
			return 0
		})
		relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
		relayDone := make(chan error, 1)
		go func() { relayDone <- r.Run(relayCtx) }()
		// Stop the relay after the HTTP server has drained: deferred calls
		// run in reverse order, after the shutdown below.
		defer func() {
			stopRelay()
			if err := <-relayDone; err != nil {
				log.Error("relay stopped", "error", err)
			}
		}()
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}
