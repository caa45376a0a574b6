package httpapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/exactlyonce/payments/internal/metrics"
)

// TestAccessLogCanBeQuietened: the access line has a level of its own
// (ACCESS_LOG: debug keeps it out of an INFO log, off drops it) and a share
// of the successful requests it samples (ACCESS_LOG_SAMPLE), while every
// failed request (4xx, 5xx) keeps its line. About 1.4 GB a day per replica at
// 80 requests a second could only be had whole before.
func TestAccessLogCanBeQuietened(t *testing.T) {
	lines := func(o AccessLog, status int, n int) int {
		t.Helper()
		var buf bytes.Buffer
		s := &Server{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})),
			opts: Options{AccessLog: o, Metrics: metrics.New()}}
		r := chi.NewRouter()
		r.Use(s.accessLog)
		r.Get("/v1/x", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) })
		for range n {
			r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v1/x", nil))
		}
		count := 0
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var v map[string]any
			if json.Unmarshal([]byte(l), &v) == nil && v["msg"] == "request" {
				count++
			}
		}
		return count
	}
	for _, tc := range []struct {
		name   string
		o      AccessLog
		status int
		min    int
		max    int
	}{
		{"the default: every request", AccessLog{}, 201, 200, 200},
		{"debug in an INFO log: none", AccessLog{Level: slog.LevelDebug}, 201, 0, 0},
		{"off: none", AccessLog{Off: true}, 201, 0, 0},
		{"a tenth of the successes", AccessLog{Sample: 0.1}, 201, 5, 50},
		{"every failure, sampled or not", AccessLog{Sample: 0.1}, 422, 200, 200},
		{"every server error, sampled or not", AccessLog{Sample: 0.01}, 503, 200, 200},
	} {
		if got := lines(tc.o, tc.status, 200); got < tc.min || got > tc.max {
			t.Errorf("%s: %d lines for 200 requests, want %d to %d", tc.name, got, tc.min, tc.max)
		}
	}
}
