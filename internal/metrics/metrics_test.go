package metrics_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/testkit"
)

func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d", rec.Code)
	}
	return rec.Body.String()
}

// TestBacklogSampled: 100 scrapes read the backlog 0 times; the gauges, the
// outbox's and the due webhook deliveries', show -1 before the first sample
// and the last sample after it.
func TestBacklogSampled(t *testing.T) {
	m := metrics.New()
	var reads atomic.Int64
	b := m.Backlog(func(context.Context) (metrics.OutboxSample, error) {
		reads.Add(1)
		return metrics.OutboxSample{Backlog: 400_000, Oldest: 90 * time.Second, Held: 1500 * time.Millisecond,
			DueDeliveries: 250, Overdue: 2*time.Minute + 500*time.Millisecond}, nil
	})
	body := scrape(t, m)
	for _, name := range []string{"payments_outbox_backlog_events", "payments_outbox_sample_age_seconds", "payments_events_held_seconds",
		"payments_webhook_due_deliveries", "payments_webhook_overdue_seconds"} {
		if !strings.Contains(body, name+" -1\n") {
			t.Errorf("before any sample, want %s -1:\n%s", name, body)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, time.Hour, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	for reads.Load() == 0 || !strings.Contains(scrape(t, m), "payments_outbox_samples_total 1\n") {
		time.Sleep(time.Millisecond)
	}

	before := reads.Load()
	for range 100 {
		body = scrape(t, m)
	}
	if got := reads.Load() - before; got != 0 {
		t.Errorf("100 scrapes read the backlog %d times, want 0", got)
	}
	for _, want := range []string{
		"payments_outbox_backlog_events 400000\n",
		"payments_outbox_oldest_unpublished_seconds 90\n",
		"payments_events_held_seconds 1.5\n",
		"payments_webhook_due_deliveries 250\n",
		"payments_webhook_overdue_seconds 120.5\n",
		"payments_outbox_sample_errors_total 0\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the metrics lack %q", want)
		}
	}
}

// TestBacklogSampleFails: a failed sample is counted and leaves the last good
// one, whose age keeps growing.
func TestBacklogSampleFails(t *testing.T) {
	m := metrics.New()
	var calls atomic.Int64
	b := m.Backlog(func(context.Context) (metrics.OutboxSample, error) {
		if calls.Add(1) > 1 {
			return metrics.OutboxSample{}, errors.New("database down")
		}
		return metrics.OutboxSample{Backlog: 7, Oldest: time.Second}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, 10*time.Millisecond, slog.New(slog.DiscardHandler)) }()
	// At least three failures: the sampler goes on every 10 to 40 ms (its
	// backoff), so the count may pass any exact value between two scrapes.
	for counter(t, scrape(t, m), "payments_outbox_sample_errors_total") < 3 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	body := scrape(t, m)
	if !strings.Contains(body, "payments_outbox_backlog_events 7\n") || strings.Contains(body, "payments_outbox_sample_age_seconds 0\n") {
		t.Errorf("after failed samples, want the last good one (7) and a growing age:\n%s", body)
	}
}

// TestBacklogSamplerLogsAnOutageOnce: while its reads fail, the sampler
// tries again less and less often (ceilings from one interval up to four) and
// writes one WARN for the outage; when a read succeeds again, one INFO says
// so, with the attempts, and the gauges show the new sample.
func TestBacklogSamplerLogsAnOutageOnce(t *testing.T) {
	m := metrics.New()
	var down atomic.Bool
	down.Store(true)
	b := m.Backlog(func(context.Context) (metrics.OutboxSample, error) {
		if down.Load() {
			return metrics.OutboxSample{}, errors.New("database down")
		}
		return metrics.OutboxSample{Backlog: 12}, nil
	})
	logs := &testkit.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, interval, log) }()
	defer func() { cancel(); <-done }()
	lines := func() []testkit.LogLine { return testkit.JSONLog(t, logs.String(), "outbox sampler: read the outbox") }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s; log:\n%s", what, logs.Tail(3000))
			}
		}
	}

	waitFor("three waits at the cap", func() bool { return len(testkit.Where(lines(), "backoff_ceiling", (4*interval).String())) >= 3 })
	down.Store(false)
	waitFor("the sampler is back", func() bool { return len(testkit.Where(lines(), "state", "up")) == 1 })

	all := lines()
	attempts := testkit.Where(all, "state", "down", "retrying")
	for i, ln := range attempts {
		want := []time.Duration{interval, 2 * interval, 4 * interval}[min(i, 2)]
		if ln["backoff_ceiling"] != want.String() {
			t.Errorf("attempt %d: ceiling %v, want %v", i+1, ln["backoff_ceiling"], want)
		}
	}
	if warns := testkit.Where(testkit.JSONLog(t, logs.String(), ""), "level", "WARN", "ERROR"); len(warns) != 1 || warns[0]["state"] != "down" {
		t.Errorf("%d WARN/ERROR lines for one outage of %d failed samples, want one (down): %v", len(warns), len(attempts), warns)
	}
	if up := testkit.Where(all, "state", "up")[0]; up["level"] != "INFO" || up["attempts"] != float64(len(attempts)) {
		t.Errorf("the end of the outage: %v, want INFO with attempts %d", up, len(attempts))
	}
	if body := scrape(t, m); !strings.Contains(body, "payments_outbox_backlog_events 12\n") {
		t.Errorf("after the outage, want the new sample (12):\n%s", body)
	}
}

// counter returns the value of an unlabelled metric in a scrape, or -1.
func counter(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// TestBuildInfo: payments_build_info is 1, a gauge, with the build's labels.
func TestBuildInfo(t *testing.T) {
	m := metrics.New()
	m.BuildInfo("v1.2.0-3-g74131fb-dirty", "74131fbc8d0e", "go1.26.8")
	body := scrape(t, m)
	for _, want := range []string{
		"# TYPE payments_build_info gauge\n",
		`payments_build_info{commit="74131fbc8d0e",go_version="go1.26.8",version="v1.2.0-3-g74131fb-dirty"} 1` + "\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the scrape lacks %q:\n%s", want, body)
		}
	}
}

// TestWebhookLag: the delivery-lag histogram has both attempt series from
// the start, and counts each delivery under first or retry by its attempt.
func TestWebhookLag(t *testing.T) {
	m := metrics.New()
	lag := m.WebhookLag()
	for _, attempt := range []string{"first", "retry"} {
		if got := counter(t, scrape(t, m), `payments_webhook_delivery_lag_seconds_count{attempt="`+attempt+`"}`); got != 0 {
			t.Errorf("before any delivery, the %s series counts %v, want 0", attempt, got)
		}
	}
	lag.Delivered(40*time.Millisecond, 1)
	lag.Delivered(20*time.Millisecond, 1)
	lag.Delivered(2*time.Hour, 5)
	body := scrape(t, m)
	for series, want := range map[string]float64{
		`payments_webhook_delivery_lag_seconds_count{attempt="first"}`:             2,
		`payments_webhook_delivery_lag_seconds_bucket{attempt="first",le="0.025"}`: 1,
		`payments_webhook_delivery_lag_seconds_bucket{attempt="first",le="0.05"}`:  2,
		`payments_webhook_delivery_lag_seconds_count{attempt="retry"}`:             1,
		`payments_webhook_delivery_lag_seconds_sum{attempt="retry"}`:               7200,
		`payments_webhook_delivery_lag_seconds_bucket{attempt="retry",le="3600"}`:  0,
	} {
		if got := counter(t, body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}
