package metrics_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/metrics"
)

// TestReconciliationSampled: the reconciliation gauges read -1 before the
// first sample; with no run recorded, the last run's time is 0 where a
// processor is configured (the staleness alert fires) and -1 where none
// is; then the newest run's mismatches and time; a failed sample keeps
// the last good one.
func TestReconciliationSampled(t *testing.T) {
	finished := time.Date(2026, 12, 6, 3, 0, 0, 500_000_000, time.UTC)
	for _, tc := range []struct {
		name     string
		expected bool
		samples  []metrics.ReconcileSample
		want     []string // after each sample
	}{
		{"a processor, never reconciled, then a run", true,
			[]metrics.ReconcileSample{{}, {Ran: true, Mismatches: 3, FinishedAt: finished}},
			[]string{"payments_reconcile_last_run_timestamp_seconds 0\npayments_reconcile_mismatches -1\n",
				"payments_reconcile_last_run_timestamp_seconds 1.7965260005e+09\npayments_reconcile_mismatches 3\n"}},
		{"no processor, never reconciled", false, []metrics.ReconcileSample{{}},
			[]string{"payments_reconcile_last_run_timestamp_seconds -1\npayments_reconcile_mismatches -1\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := metrics.New()
			next := make(chan metrics.ReconcileSample)
			var mu sync.Mutex
			fail := false
			s := m.Reconciliation(tc.expected, func(ctx context.Context) (metrics.ReconcileSample, error) {
				mu.Lock()
				defer mu.Unlock()
				if fail {
					return metrics.ReconcileSample{}, errors.New("database down")
				}
				select {
				case r := <-next:
					return r, nil
				case <-ctx.Done():
					return metrics.ReconcileSample{}, ctx.Err()
				}
			})
			if got := gauges(scrape(t, m)); got != "payments_reconcile_last_run_timestamp_seconds -1\npayments_reconcile_mismatches -1\n" {
				t.Errorf("before any sample:\n%s", got)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); s.Run(ctx, 20*time.Millisecond, slog.New(slog.DiscardHandler)) }()
			for i, sample := range tc.samples {
				next <- sample
				waitFor(t, func() bool { return gauges(scrape(t, m)) == tc.want[i] }, "sample %d: %s, got %s", i, tc.want[i], gauges(scrape(t, m)))
			}
			mu.Lock()
			fail = true
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			if got := gauges(scrape(t, m)); got != tc.want[len(tc.want)-1] {
				t.Errorf("after failed samples:\n%s", got)
			}
			cancel()
			<-done
		})
	}
}

// gauges are the reconciliation gauges' sample lines of a scrape.
func gauges(body string) string {
	var out strings.Builder
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "payments_reconcile_") {
			out.WriteString(l + "\n")
		}
	}
	return out.String()
}

func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: "+format, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
