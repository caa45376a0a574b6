package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Relay records what an outbox relay publishes: the events per publishing
// round, each event's commit-to-publish latency and the rounds that failed.
// It implements relay.Observer; its methods are safe for concurrent use and
// never block. The relay's counters (payments_relay_published_total, ...) are
// read from its Stats and registered with CounterFunc.
type Relay struct {
	batch    prometheus.Histogram
	latency  prometheus.Histogram
	failures *prometheus.CounterVec
}

// Relay registers the relay's histograms and its failure counter, with a
// series at 0 for each of reasons (relay.FailureReasons), and returns what
// records them.
func (m *Metrics) Relay(reasons []string) *Relay {
	r := &Relay{
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "payments_relay_batch_events",
			Help:    "Events the broker acknowledged per publishing round (RELAY_BATCH bounds it); one cursor write covers a round.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 to 1024
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "payments_relay_commit_to_publish_seconds",
			Help: "From an event's commit (its outbox row's created_at, its transaction's start) to the broker's acknowledgement of it; events the broker already had are not counted.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10,
				30, 60, 120, 300, 600},
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payments_relay_publish_failures_total",
			Help: "Publishing rounds that failed, by reason: stream (NATS or JetStream unreachable), send, refused (the broker answered an error), timeout (no acknowledgement).",
		}, []string{"reason"}),
	}
	m.reg.MustRegister(r.batch, r.latency, r.failures)
	for _, reason := range reasons {
		r.failures.WithLabelValues(reason)
	}
	return r
}

// Batch records a publishing round of n acknowledged events.
func (r *Relay) Batch(n int) { r.batch.Observe(float64(n)) }

// Published records one event the broker stored, sinceCommit after its commit.
func (r *Relay) Published(sinceCommit time.Duration) { r.latency.Observe(sinceCommit.Seconds()) }

// Failed records a failed publishing round and its reason.
func (r *Relay) Failed(reason string) { r.failures.WithLabelValues(reason).Inc() }

// LabeledCounterFunc registers a counter named name with one series per entry
// of series, each labelled label="<its key>" and read from its function at
// each scrape.
func (m *Metrics) LabeledCounterFunc(name, help, label string, series map[string]func() float64) {
	for value, f := range series {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name, Help: help, ConstLabels: prometheus.Labels{label: value},
		}, f))
	}
}

// WebhookLag records how long each webhook delivery took to arrive. Its
// methods are safe for concurrent use and never block.
type WebhookLag struct{ first, retry prometheus.Observer }

// Values of payments_webhook_delivery_lag_seconds's attempt label.
const (
	LagFirstAttempt = "first" // delivered by its first attempt
	LagRetried      = "retry" // delivered by a later one, after failures
)

// WebhookLag registers payments_webhook_delivery_lag_seconds, with a series
// at 0 for each value of its attempt label, and returns what records it.
func (m *Metrics) WebhookLag() *WebhookLag {
	lag := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "payments_webhook_delivery_lag_seconds",
		Help: "From an event's creation (its created_at, its transaction's start) to the 2xx that delivered it to an endpoint, by attempt: first (delivered by its first attempt) or retry (by a later one, after failures and their backoff).",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600,
			3 * 3600, 12 * 3600, 24 * 3600, 72 * 3600},
	}, []string{"attempt"})
	m.reg.MustRegister(lag)
	return &WebhookLag{first: lag.WithLabelValues(LagFirstAttempt), retry: lag.WithLabelValues(LagRetried)}
}

// Delivered records a delivery answered with a 2xx sinceEvent after its
// event's creation, by its attempt-th attempt (1 for the first).
func (w *WebhookLag) Delivered(sinceEvent time.Duration, attempt int) {
	o := w.first
	if attempt > 1 {
		o = w.retry
	}
	o.Observe(max(0, sinceEvent.Seconds()))
}
