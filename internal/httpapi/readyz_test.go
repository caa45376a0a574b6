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
// documents it; the API goes on answering.
func TestReadyzWhileShuttingDown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	srv := httptest.NewServer(httpapi.New(stopping{f.store}, slog.New(slog.DiscardHandler), httpapi.Options{}))
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
}
