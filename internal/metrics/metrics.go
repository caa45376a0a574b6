// Package metrics exposes the service's Prometheus metrics: HTTP requests,
// idempotency outcomes, charges, the connection pool, the outbox and the
// janitor. Raw keys never become labels; labels have a small fixed set of
// values.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/exactlyonce/payments/internal/groupcommit"
	"github.com/exactlyonce/payments/internal/retry"
)

// Metrics records what the API does. Its methods are safe for concurrent use.
type Metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.HistogramVec
	idempotency *prometheus.CounterVec
	charges     *prometheus.CounterVec
	abandoned   *prometheus.CounterVec
	limited     *prometheus.CounterVec
}

// Idempotency outcomes, the values of the outcome label.
const (
	OutcomeClaimed  = "claimed"  // executed under a fresh key
	OutcomeReplayed = "replayed" // answered from a stored response
	OutcomeMismatch = "mismatch" // the key was used for another request
	OutcomeInUse    = "in_use"   // the key was still being processed past the wait bound
	OutcomeExpired  = "expired"  // a key past its retention was found and forgotten
)

// NewProcess returns metrics registered on a fresh registry with only the Go
// runtime and process collectors: what every process exports before its own
// series (payments relay and payments consume add theirs). The HTTP API's
// methods (Request, Idempotency, Charge, ChargeAbandoned) are New's.
func NewProcess() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Metrics{reg: reg}
}

// New returns NewProcess's metrics and the HTTP API's series: what payments
// serve exports.
func New() *Metrics {
	m := NewProcess()
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "payments_http_request_duration_seconds",
		Help:    "HTTP request duration by route pattern, method and status.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"route", "method", "status"})
	m.idempotency = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_idempotency_outcomes_total",
		Help: "Requests by what their Idempotency-Key meant: claimed, replayed, mismatch, in_use, expired.",
	}, []string{"outcome"})
	m.charges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_charges_total",
		Help: "Charges executed (replays not counted) by status: succeeded, failed, authorized (created with capture: false).",
	}, []string{"status"})
	m.abandoned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_charges_abandoned_total",
		Help: "Charges whose client left before its answer, by what became of them: executed, replayed, not_executed, failed.",
	}, []string{"outcome"})
	m.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_rate_limited_total",
		Help: "Requests refused 429 rate-limited, over their merchant's budget on this replica, by kind: reads, writes.",
	}, []string{"kind"})
	m.reg.MustRegister(m.requests, m.idempotency, m.charges, m.abandoned, m.limited)
	m.limited.WithLabelValues("reads")
	m.limited.WithLabelValues("writes")
	for _, o := range []string{OutcomeClaimed, OutcomeReplayed, OutcomeMismatch, OutcomeInUse, OutcomeExpired} {
		m.idempotency.WithLabelValues(o)
	}
	for _, o := range AbandonedOutcomes {
		m.abandoned.WithLabelValues(o)
	}
	return m
}

// AbandonedOutcomes are the values of payments_charges_abandoned_total's
// outcome label (postgres.Abandoned*).
var AbandonedOutcomes = []string{"executed", "replayed", "not_executed", "failed"}

// RateLimited records a request refused over its merchant's budget; kind is
// reads or writes.
func (m *Metrics) RateLimited(kind string) { m.limited.WithLabelValues(kind).Inc() }

// ChargeAbandoned records what became of a charge whose client left; outcome
// is one of AbandonedOutcomes.
func (m *Metrics) ChargeAbandoned(outcome string) { m.abandoned.WithLabelValues(outcome).Inc() }

// ChargeBatcher registers the charge batcher's gauges and counters, read from
// stats at each scrape (which never waits for a batch), and stuckAfter, the
// age past which a batch is stuck (IDEMPOTENCY_WAIT + COMMIT_WAIT), which the
// alerting rule compares the batch's age with.
func (m *Metrics) ChargeBatcher(stats func() groupcommit.Stats, stuckAfter time.Duration) {
	gauge := func(name, help string, f func(groupcommit.Stats) float64) {
		m.GaugeFunc(name, help, func() float64 { return f(stats()) })
	}
	counter := func(name, help string, f func(groupcommit.Stats) uint64) {
		m.CounterFunc(name, help, func() float64 { return float64(f(stats())) })
	}
	gauge("payments_charge_batch_age_seconds", "How long the oldest charge batch in flight has run (0: none runs).",
		func(s groupcommit.Stats) float64 { return s.BatchAge.Seconds() })
	gauge("payments_charge_queue_wait_seconds", "How long the oldest charge waiting for a batch has waited (0: none waits).",
		func(s groupcommit.Stats) float64 { return s.QueueWait.Seconds() })
	gauge("payments_charge_queue_length", "Charges waiting for a batch.",
		func(s groupcommit.Stats) float64 { return float64(s.Queued) })
	m.GaugeFunc("payments_charge_batch_stuck_after_seconds", "The age past which a charge batch is stuck: IDEMPOTENCY_WAIT + COMMIT_WAIT.",
		func() float64 { return stuckAfter.Seconds() })
	counter("payments_charge_batches_total", "Charge batches run.",
		func(s groupcommit.Stats) uint64 { return s.Batches })
	counter("payments_charge_queue_timeouts_total", "Charges that waited IDEMPOTENCY_WAIT for a batch and were answered 503, not executed.",
		func(s groupcommit.Stats) uint64 { return s.QueueTimeouts })
}

// ChargeAhead registers the counters of the charge batches decided ahead
// (internal/charging, ahead.go), read from stats at each scrape: those that
// committed in one round trip, and those the database refused because a key
// or an account was not as this process recorded it (they ran again the
// usual way, so a refusal costs a round trip, never an answer).
func (m *Metrics) ChargeAhead(stats func() (committed, refused uint64)) {
	m.CounterFunc("payments_charge_batches_ahead_total", "Charge batches decided ahead against this process's record of their accounts and committed in one round trip.",
		func() float64 { c, _ := stats(); return float64(c) })
	m.CounterFunc("payments_charge_batches_ahead_refused_total", "Charge batches decided ahead that the database refused (a key in flight or stored, an account changed or locked elsewhere); each ran again the usual way.",
		func() float64 { _, r := stats(); return float64(r) })
}

// BuildInfo registers payments_build_info, always 1, whose labels say which
// build runs: its version, commit and Go version (`payments version`). Join
// on it to see a change of build in any other series.
func (m *Metrics) BuildInfo(version, commit, goVersion string) {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "payments_build_info",
		Help:        "Always 1; the labels say which build runs (payments version).",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "go_version": goVersion},
	})
	info.Set(1)
	m.reg.MustRegister(info)
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Request records one HTTP request. route is the route pattern, never the raw
// path, so ids do not become labels.
func (m *Metrics) Request(route, method string, status int, d time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Observe(d.Seconds())
}

// Idempotency records what a request's key meant.
func (m *Metrics) Idempotency(outcome string) { m.idempotency.WithLabelValues(outcome).Inc() }

// Charge records an executed charge by its status.
func (m *Metrics) Charge(status string) { m.charges.WithLabelValues(status).Inc() }

// CounterFunc registers a counter read from f at each scrape.
func (m *Metrics) CounterFunc(name, help string, f func() float64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}

// GaugeFunc registers a gauge read from f at each scrape.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// Pool registers the connection pool's statistics.
func (m *Metrics) Pool(pool *pgxpool.Pool) {
	stat := func(f func(*pgxpool.Stat) float64) func() float64 { return func() float64 { return f(pool.Stat()) } }
	m.GaugeFunc("payments_db_pool_acquired_conns", "Connections in use.", stat(func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }))
	m.GaugeFunc("payments_db_pool_idle_conns", "Idle connections.", stat(func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }))
	m.GaugeFunc("payments_db_pool_total_conns", "Open connections.", stat(func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }))
	m.GaugeFunc("payments_db_pool_max_conns", "The pool's size.", stat(func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }))
	m.CounterFunc("payments_db_pool_acquires_total", "Connections acquired.", stat(func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }))
	m.CounterFunc("payments_db_pool_empty_acquires_total", "Acquires that had to wait for a connection.", stat(func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }))
	m.CounterFunc("payments_db_pool_acquire_wait_seconds_total", "Time spent waiting for connections.", stat(func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }))
}

// OutboxSample is one reading of the outbox.
type OutboxSample struct {
	// Backlog is how many events wait to be published; Oldest is the age of
	// the oldest of them, the publish lag.
	Backlog int64
	Oldest  time.Duration
	// Held is how long the oldest committed event has waited for an older
	// transaction of the database to end (the event horizon); 0 when none
	// waits.
	Held time.Duration
	// DueDeliveries is how many webhook deliveries are due (counted up to a
	// bound); Overdue how long the most overdue of them has waited since it
	// came due, 0 when none is due.
	DueDeliveries int64
	Overdue       time.Duration
}

// BacklogSampler reads the outbox in the background and holds the last
// sample, so a scrape never queries the database.
type BacklogSampler struct {
	read    func(context.Context) (OutboxSample, error)
	mu      sync.Mutex
	last    OutboxSample // every field is -1 until the first sample
	at      time.Time    // when the last good sample was taken
	samples atomic.Int64
	errors  atomic.Int64
}

// Backlog registers the outbox gauges and the webhook deliveries' (the
// webhooks' outbox), fed by the returned sampler's Run with read.
func (m *Metrics) Backlog(read func(context.Context) (OutboxSample, error)) *BacklogSampler {
	b := &BacklogSampler{read: read, last: OutboxSample{Backlog: -1, Oldest: -1, Held: -1, DueDeliveries: -1, Overdue: -1}}
	last := func(pick func(*BacklogSampler) float64) func() float64 {
		return func() float64 {
			b.mu.Lock()
			defer b.mu.Unlock()
			return pick(b)
		}
	}
	seconds := func(d time.Duration) float64 {
		if d < 0 {
			return -1
		}
		return d.Seconds()
	}
	m.GaugeFunc("payments_outbox_backlog_events", "Events not yet published, as last sampled (-1: no sample yet).",
		last(func(b *BacklogSampler) float64 { return float64(b.last.Backlog) }))
	m.GaugeFunc("payments_outbox_oldest_unpublished_seconds", "Age of the oldest unpublished event, as last sampled: the publish lag (-1: no sample yet).",
		last(func(b *BacklogSampler) float64 { return seconds(b.last.Oldest) }))
	m.GaugeFunc("payments_events_held_seconds", "How long the oldest committed event has waited, as last sampled, for an older transaction of the database to end before the feed and the relay may list it (the event horizon; 0: none waits, -1: no sample yet).",
		last(func(b *BacklogSampler) float64 { return seconds(b.last.Held) }))
	m.GaugeFunc("payments_webhook_due_deliveries", "Webhook deliveries due, as last sampled: pending, on a live enabled endpoint, their attempt's time come (in flight included; those waiting out a backoff are not due); counted up to a bound, where it stays past it (-1: no sample yet).",
		last(func(b *BacklogSampler) float64 { return float64(b.last.DueDeliveries) }))
	m.GaugeFunc("payments_webhook_overdue_seconds", "How long the most overdue webhook delivery has waited since it came due (its first attempt's time, or its last failure's plus the backoff), as last sampled (0: none is due, -1: no sample yet).",
		last(func(b *BacklogSampler) float64 { return seconds(b.last.Overdue) }))
	m.GaugeFunc("payments_outbox_sample_age_seconds", "Seconds since the outbox backlog was last sampled (-1: never).",
		last(func(b *BacklogSampler) float64 {
			if b.at.IsZero() {
				return -1
			}
			return time.Since(b.at).Seconds()
		}))
	m.CounterFunc("payments_outbox_samples_total", "Outbox backlog samples taken.",
		func() float64 { return float64(b.samples.Load()) })
	m.CounterFunc("payments_outbox_sample_errors_total", "Outbox backlog samples that failed (the last good one stays).",
		func() float64 { return float64(b.errors.Load()) })
	return b
}

// Run samples at once and then every interval until ctx ends; a sample may
// take at most interval. After a failed sample it tries again with the
// service's backoff for periodic work (retry.Periodic: within an interval at
// first, then up to four intervals apart), and log, writing to log, gets the
// outage as state changes ("outbox sampler: read the outbox": down, still
// down once a minute, up), not a line per sample.
func (b *BacklogSampler) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	loop := retry.NewLoop(log, "outbox sampler: read the outbox", retry.Periodic(interval))
	for {
		if err := b.sample(ctx, interval); err != nil && ctx.Err() == nil {
			if !loop.Fail(ctx, err) {
				return
			}
			continue
		}
		loop.Succeed()
		if !retry.Sleep(ctx, interval) {
			return
		}
	}
}

func (b *BacklogSampler) sample(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sample, err := b.read(ctx)
	b.samples.Add(1)
	if err != nil {
		b.errors.Add(1)
		return err
	}
	b.mu.Lock()
	b.last, b.at = sample, time.Now()
	b.mu.Unlock()
	return nil
}
