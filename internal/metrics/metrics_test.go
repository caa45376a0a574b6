package metrics_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/metrics"
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

// TestBacklogSampled: 100 scrapes read the backlog 0 times; the gauges show
// the last sample.
func TestBacklogSampled(t *testing.T) {
	m := metrics.New()
	var reads atomic.Int64
	b := m.Backlog(func(context.Context) (metrics.OutboxSample, error) {
		reads.Add(1)
		return metrics.OutboxSample{Backlog: 400_000, Oldest: 90 * time.Second, Held: 1500 * time.Millisecond}, nil
	})
	if body := scrape(t, m); !strings.Contains(body, "payments_outbox_backlog_events -1\n") ||
		!strings.Contains(body, "payments_outbox_sample_age_seconds -1\n") ||
		!strings.Contains(body, "payments_events_held_seconds -1\n") {
		t.Errorf("before any sample, want -1:\n%s", body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, time.Hour) }()
	defer func() { cancel(); <-done }()
	for reads.Load() == 0 || !strings.Contains(scrape(t, m), "payments_outbox_samples_total 1\n") {
		time.Sleep(time.Millisecond)
	}

	before := reads.Load()
	var body string
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
	go func() { defer close(done); b.Run(ctx, 10*time.Millisecond) }()
	// At least three failures: the sampler goes on every 10 ms, so the count
	// may pass any exact value between two scrapes.
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
