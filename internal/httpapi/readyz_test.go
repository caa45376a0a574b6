package httpapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/testkit"
)

// stopping is the backend of a process asked to stop: cmd/payments's Ready
// says so from the signal on.
type stopping struct{ testkit.Service }

func (stopping) Ready(context.Context) error {
	return fmt.Errorf("%w: SIGTERM received", payment.ErrShuttingDown)
}

// TestReadyzWhileShuttingDown: /readyz of a process asked to stop answers 503
// shutting-down, whose detail says what is going on, as openapi.yaml
// documents it; the API goes on answering. The drain is planned: however
// often its load balancer asks, nothing is logged at WARN or above.
func TestReadyzWhileShuttingDown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	logs := &testkit.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := httptest.NewServer(httpapi.New(stopping{f.store}, log, httpapi.Options{}))
	t.Cleanup(srv.Close)
	g := *f
	g.url = srv.URL
	r := g.get("/readyz")
	if r.status != http.StatusServiceUnavailable || r.code(t) != "shutting-down" || !strings.Contains(string(r.body), "SHUTDOWN_DELAY") {
		t.Errorf("/readyz while shutting down: %d %s, want 503 shutting-down", r.status, r.body)
	}
	if r := g.get("/v1/charges"); r.status != http.StatusOK {
		t.Errorf("GET /v1/charges while shutting down: %d %s, want 200", r.status, r.body)
	}
	for range 3 {
		g.get("/readyz")
	}
	if loud := testkit.Where(testkit.JSONLog(t, logs.String(), ""), "level", "WARN", "ERROR"); len(loud) > 0 {
		t.Errorf("/readyz while shutting down logged %d lines at WARN or above, want none: %v", len(loud), loud)
	}
}
