package benchrun

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/lab/internal/labtest"
)

// StartSimulator runs the real simulator on a database of its own, finds
// the port it picked, and Stop ends it.
func TestSimulatorStartsAndStops(t *testing.T) {
	bin := labtest.Procsim(t)
	logPath := filepath.Join(t.TempDir(), "procsim.log")
	sim, err := StartSimulator(t.Context(), bin, labtest.NewDatabase(t), logPath, "-slow-delay", "50ms")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	if !strings.HasPrefix(sim.URL, "http://127.0.0.1:") || sim.PID <= 0 {
		t.Errorf("simulator at %q, pid %d; want a loopback URL and a process", sim.URL, sim.PID)
	}
	body := `{"amount":100,"currency":"USD","payment_method":"pm_card_slow","reference":"ch_bench"}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, sim.URL+"/v1/authorizations", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "bench-slow")
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if took := time.Since(began); resp.StatusCode != http.StatusOK || took < 50*time.Millisecond {
		t.Errorf("pm_card_slow: %d after %s, want 200 after -slow-delay 50ms", resp.StatusCode, took)
	}
	sim.Stop()
	sim.Stop() // twice is fine
	if sim.healthy(t.Context()) {
		t.Error("the simulator still answers after Stop")
	}
}

// A simulator that cannot start (no database) fails with the end of its log.
func TestSimulatorThatCannotStart(t *testing.T) {
	bin := labtest.Procsim(t)
	logPath := filepath.Join(t.TempDir(), "procsim.log")
	_, err := StartSimulator(t.Context(), bin, "postgres://nobody@127.0.0.1:1/none", logPath)
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("StartSimulator without a database: %v, want it to say the simulator exited", err)
	}
}

func TestPollerAndWithin(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "payments_db_pool_acquired_conns 3\npayments_db_pool_max_conns 20\n")
	}))
	defer srv.Close()
	p := StartPoller(srv.URL, 10*time.Millisecond, "payments_db_pool_acquired_conns", "payments_db_pool_max_conns")
	time.Sleep(60 * time.Millisecond)
	readings := p.Stop()
	if len(readings) < 2 || readings[0].Values["payments_db_pool_max_conns"] != 20 {
		t.Fatalf("readings %v, want several with the pool's size", readings)
	}
	from, to := readings[0].UnixMs+1, readings[len(readings)-1].UnixMs
	for _, r := range Within(readings, from, to) {
		if r.UnixMs < from || r.UnixMs > to {
			t.Errorf("Within(%d, %d) kept a reading at %d", from, to, r.UnixMs)
		}
	}
	if got := Within(readings, 0, to); len(got) != len(readings) {
		t.Errorf("Within from 0: %d of %d readings", len(got), len(readings))
	}
	if (*Poller)(nil).Stop() != nil {
		t.Error("a nil poller has readings")
	}
}
