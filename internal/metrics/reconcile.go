package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/exactlyonce/payments/internal/retry"
)

// ReconcileSample is the newest run of payments reconcile as serve reads
// it: Ran is false while none is recorded.
type ReconcileSample struct {
	Ran        bool
	Mismatches int64
	FinishedAt time.Time
}

// ReconcileSampler reads the newest reconciliation run in the background
// and holds it, so a scrape never queries the database: payments reconcile
// is a process of its own, which records its runs in the database.
type ReconcileSampler struct {
	read     func(context.Context) (ReconcileSample, error)
	expected bool
	mu       sync.Mutex
	last     ReconcileSample
	sampled  bool
}

// Reconciliation registers the gauges of the newest reconciliation run,
// fed by the returned sampler's Run with read. expected says a card
// processor is configured, whose charges a job should reconcile: then no
// run recorded reads as a run at time 0, which the staleness alert fires on.
func (m *Metrics) Reconciliation(expected bool, read func(context.Context) (ReconcileSample, error)) *ReconcileSampler {
	s := &ReconcileSampler{read: read, expected: expected}
	m.GaugeFunc("payments_reconcile_mismatches",
		"References that disagreed with the card processor's records in the newest run of payments reconcile, as last sampled (-1: no run recorded or no sample yet).",
		func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.sampled || !s.last.Ran {
				return -1
			}
			return float64(s.last.Mismatches)
		})
	m.GaugeFunc("payments_reconcile_last_run_timestamp_seconds",
		"When the newest run of payments reconcile finished, as last sampled (0: none recorded while a card processor is configured; -1: none and none expected, or no sample yet).",
		func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			switch {
			case !s.sampled:
				return -1
			case s.last.Ran:
				return float64(s.last.FinishedAt.UnixMilli()) / 1000
			case s.expected:
				return 0
			}
			return -1
		})
	return s
}

// Run samples at once and then every interval until ctx ends, backing off
// after a failure as BacklogSampler.Run does; a failed sample keeps the last
// good one.
func (s *ReconcileSampler) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	loop := retry.NewLoop(log, "reconciliation sampler: read the last run", retry.Periodic(interval))
	for {
		sctx, cancel := context.WithTimeout(ctx, interval)
		sample, err := s.read(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			if !loop.Fail(ctx, err) {
				return
			}
			continue
		}
		if err == nil {
			s.mu.Lock()
			s.last, s.sampled = sample, true
			s.mu.Unlock()
			loop.Succeed()
		}
		if !retry.Sleep(ctx, interval) {
			return
		}
	}
}
