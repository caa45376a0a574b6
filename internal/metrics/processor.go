package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ProcessorStates are the final states of an operation at the card
// processor, the values of payments_processor_resolve_seconds's state label.
var ProcessorStates = []string{"succeeded", "failed", "reversed", "requires_review"}

// ProcessorResolved registers the histogram of the time card charges take
// to reach a final state, from their creation, and returns what records
// one.
func (m *Metrics) ProcessorResolved() func(state string, took time.Duration) {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "payments_processor_resolve_seconds",
		Help:    "From a card charge's creation to its final state (succeeded, failed, reversed, requires_review), by that state.",
		Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
	}, []string{"state"})
	m.reg.MustRegister(h)
	for _, s := range ProcessorStates {
		h.WithLabelValues(s)
	}
	return func(state string, took time.Duration) { h.WithLabelValues(state).Observe(took.Seconds()) }
}
