package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments"
	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/webhook"
)

// maxHeaderBytes bounds a request's headers; net/http answers 431 past it.
const maxHeaderBytes = 16 << 10

// serve runs the HTTP API until ctx is cancelled, then drains (drain.go):
// /readyz answers 503 at once, everything is served for ShutdownDelay, and
// then the listener closes and in-flight requests get up to ShutdownTimeout.
// Only after that do its deferred calls stop the rest, in the reverse order
// of their start: the relay, the profiler, the outbox sampler, the metrics
// listener and the janitor; the store closes last, once every connection is
// back, so a charge batch still committing finishes first.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	m := metrics.New()
	cfg, log, store, err := open(ctx, "serve", args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	defer store.Close()
	m.Pool(store.Pool())
	path := openCharging(cfg, store, log, m)
	cardCharges, err := openCards(ctx, cfg, store, log, m)
	if err != nil {
		return err
	}
	defer cardCharges.Wait() // the calls to the processor under way, before the store closes
	// IDEMPOTENCY_WAIT bounds a retry's wait for its twin in this process
	// (the coalescer), as lock_timeout bounds it across replicas.
	front := idempotency.NewFront(cfg.Keys.CacheSize, cfg.Keys.CacheBytes, cfg.Keys.TTL, cfg.Pool.KeyWait)
	cacheMetrics(m, front, cfg)
	if err := store.Ping(ctx); err != nil {
		// Start anyway: /readyz reports the database, and requests answer 503
		// until it is back.
		log.Warn("database not reachable at start", "error", err)
	}

	if cfg.WebhookAllowPrivate {
		log.Warn("webhook endpoints may be http URLs on local addresses", "setting", "WEBHOOK_ALLOW_PRIVATE_NETWORKS",
			"note", "for development and tests only: API callers can make the service send requests inside its network")
	}
	d := &drain{delay: cfg.Shutdown.Delay, timeout: cfg.Shutdown.Timeout}
	api := httpapi.New(backend{store, openKeys(cfg, store, m), path, d}, log, httpapi.Options{
		Spec:                 payments.OpenAPI,
		Docs:                 true,
		Front:                front,
		Metrics:              m,
		Cards:                cardCharges,
		TrustedProxies:       cfg.HTTP.TrustedProxies,
		AllowPrivateNetworks: cfg.WebhookAllowPrivate,
		AccessLog:            cfg.HTTP.AccessLog,
		Budget:               cfg.HTTP.Budget,
	})
	janitor := idempotency.NewJanitor(store, log, cfg.Keys.TTL, cfg.Keys.JanitorInterval, cfg.Keys.JanitorBatch, 10*time.Millisecond)
	janitorMetrics(m, janitor)
	stopJanitor := runBackground(ctx, janitor.Run)
	defer stopJanitor()
	stopSweeps := startSweeps(ctx, cfg, store, log, m, cardCharges.Run)
	defer stopSweeps()
	ln, err := net.Listen("tcp", cfg.HTTP.Addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTP.Addr, err)
	}
	defer ln.Close() // in case serving never starts; Shutdown closes it too
	log.Info("listening", "addr", ln.Addr().String())
	stopMetrics, err := serveMetrics("serve", cfg.MetricsAddr, m, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	// The outbox is sampled in the background on a connection of its own, for
	// the gauges and the warning about held events: a scrape does no database
	// work, and sampling takes no connection from payments.
	monitor, err := postgres.OpenMonitor(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	defer monitor.Close()
	sampler := m.Backlog(outboxSampler(monitor, cfg.Monitor.HeldWarn, log))
	stopSampler := runBackground(ctx, func(ctx context.Context) { sampler.Run(ctx, cfg.Monitor.Sample, log) })
	defer stopSampler()
	// payments reconcile records its runs; the newest is sampled likewise.
	reconciled := m.Reconciliation(cfg.Processor.kind() != processorNone, reconcileSampler(monitor))
	stopReconciled := runBackground(ctx, func(ctx context.Context) { reconciled.Run(ctx, cfg.Monitor.Sample, log) })
	defer stopReconciled()
	if cfg.Parts.PprofAddr != "" {
		stopPprof, err := servePprof(cfg.Parts.PprofAddr, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	if cfg.Parts.Relay {
		stopRelay, err := startRelay(ctx, cfg, store, log, m)
		if err != nil {
			return err
		}
		// Stop the relay after the HTTP server has drained: deferred calls
		// run in reverse order, after serveHTTP's shutdown below.
		defer stopRelay()
	}

	return serveHTTP(ctx, ln, api, d, log)
}

// serveHTTP serves h on ln until ctx is cancelled, then drains: d starts
// (/readyz 503, Connection: close), h serves on for d's delay, and the server
// shuts down, letting in-flight requests finish for up to d's timeout.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, d *drain, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           d.closeWhileDraining(h),
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	d.started.Store(true)
	log.Info("shutting down: /readyz answers 503, requests are served for SHUTDOWN_DELAY",
		"signal", stopSignal(ctx), "delay", d.delay.String(), "timeout", d.timeout.String())
	if d.wait(ctx) {
		log.Info("asked again to stop: the rest of SHUTDOWN_DELAY is skipped")
	}
	// Requests that arrive from here on are refused; those in flight finish.
	log.Info("closing the listener", "timeout", d.timeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), d.timeout)
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

// runBackground runs loop in a goroutine of its own and returns stop, which
// cancels loop's context and waits for loop to return. That context keeps
// ctx's values but not its end: ctx ending is serve's signal to drain the HTTP
// server, and the background loops run on until serve's deferred calls stop
// them, after the drain.
func runBackground(ctx context.Context, loop func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// startRelay connects to NATS and runs serve's outbox relay in the background,
// its metrics registered on m. stop ends the relay, logs the error it ended
// with, if any, and then closes the NATS connection.
func startRelay(ctx context.Context, cfg config, store *postgres.Store, log *slog.Logger, m *metrics.Metrics) (stop func(), err error) {
	r, nc, err := newRelay(cfg, store, log, m)
	if err != nil {
		return nil, err
	}
	var runErr error
	stopRun := runBackground(ctx, func(ctx context.Context) { runErr = r.Run(ctx) })
	return func() {
		stopRun()
		// stopRun waits for the relay to return, so runErr is set by now.
		if runErr != nil {
			log.Error("relay stopped", "error", runErr)
		}
		nc.Close()
	}, nil
}

// expiryBatch is the most expired authorizations the expiry sweep records
// per transaction, which holds their accounts' locks: small enough that the
// charges it makes wait are not noticed.
const expiryBatch = 500

// startSweeps starts the work serve does beside requests on every replica:
// the recovery of card charges (recovery, on every replica), the expiry
// sweep of authorizations (one replica at a time) and, unless
// WEBHOOK_DELIVERY is false, the webhook Deliverer (fan-out on one replica at
// a time, deliveries leased across all), with their metrics. The returned func stops them all and waits for them.
func startSweeps(ctx context.Context, cfg config, store *postgres.Store, log *slog.Logger, m *metrics.Metrics,
	recovery func(context.Context)) (stop func()) {
	stopRecovery := runBackground(ctx, recovery)
	expiry := charging.NewExpirySweep(store, log, cfg.Charges.ExpiryInterval, expiryBatch)
	m.CounterFunc("payments_authorizations_expired_total", "Authorizations this process recorded as expired (the expiry sweep; one replica sweeps at a time).",
		func() float64 { return float64(expiry.Expired()) })
	stopExpiry := runBackground(ctx, expiry.Run)

	stopWebhooks := func() {}
	if cfg.Parts.WebhookDelivery {
		deliverer := webhook.NewDeliverer(store, log, webhook.Options{AllowPrivate: cfg.WebhookAllowPrivate, Retention: cfg.Relay.EventRetention,
			OnDelivered: webhookLag(m)})
		for outcome, n := range map[string]*atomic.Int64{
			"delivered": &deliverer.Stats.Delivered, "failed": &deliverer.Stats.Failed, "abandoned": &deliverer.Stats.Abandoned,
		} {
			m.CounterFunc("payments_webhook_"+outcome+"_total", "Webhook delivery attempts of this process that "+webhookOutcomes[outcome]+".",
				func() float64 { return float64(n.Load()) })
		}
		m.CounterFunc("payments_webhook_records_pruned_total", "Webhook attempts and settled deliveries this process deleted, older than EVENT_RETENTION (one replica prunes at a time).",
			func() float64 { return float64(deliverer.Stats.Pruned.Load()) })
		stopWebhooks = runBackground(ctx, deliverer.Run)
	}
	return func() {
		stopWebhooks()
		stopExpiry()
		stopRecovery()
	}
}

// webhookOutcomes says what each webhook counter counts.
var webhookOutcomes = map[string]string{
	"delivered": "were acknowledged with a 2xx",
	"failed":    "failed (another status, a timeout, a refused connection) and will be retried",
	"abandoned": "failed past the retry period, abandoning the delivery and disabling its endpoint",
}
