package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestDrainServesUntilHurried runs serve with a SHUTDOWN_DELAY of a minute and
// stops it: from the stop on, /readyz answers 503 shutting-down while the
// API goes on answering, every response with Connection: close; the
// process stays up through the delay until it is asked a second time, and
// then it stops at once, its listener refusing connections.
// internal/chaos's TestDrain runs the real binary under load.
func TestDrainServesUntilHurried(t *testing.T) {
	env := envOf(map[string]string{"DATABASE_URL": pgtest.NewDatabase(t), "HTTP_ADDR": "127.0.0.1:0",
		"METRICS_ADDR": "off", "RELAY_ENABLED": "false", "SHUTDOWN_DELAY": "1m", "SHUTDOWN_TIMEOUT": "5s"})
	logs := &testkit.LogBuffer{}
	hurry := make(chan struct{})
	ctx, stop := context.WithCancel(withHurry(context.Background(), hurry))
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, io.Discard, logs) }()
	addr := waitForAddr(t, logs)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp, string(b)
	}
	if resp, body := get("/readyz"); resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("before the stop: /readyz %d %s (Connection: close %t), want 200 kept alive", resp.StatusCode, body, resp.Close)
	}

	stop() // the first SIGTERM
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"shutting down`) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start draining; logs:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	resp, body := get("/readyz")
	var problem struct{ Code, Detail string }
	_ = json.Unmarshal([]byte(body), &problem)
	if resp.StatusCode != http.StatusServiceUnavailable || problem.Code != "shutting-down" || !strings.Contains(problem.Detail, "SHUTDOWN_DELAY") {
		t.Errorf("draining: /readyz %d %s, want 503 shutting-down", resp.StatusCode, body)
	}
	if !resp.Close {
		t.Error("draining: /readyz without Connection: close")
	}
	for _, path := range []string{"/healthz", "/openapi.yaml", "/v1/charges"} {
		resp, body := get(path)
		if resp.StatusCode == http.StatusServiceUnavailable || !resp.Close {
			t.Errorf("draining: %s %d %.80q (Connection: close %t), want it served, with Connection: close", path, resp.StatusCode, body, resp.Close)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("serve returned %v within its SHUTDOWN_DELAY", err)
	case <-time.After(300 * time.Millisecond):
	}

	close(hurry) // the second SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop when asked a second time")
	}
	if !strings.Contains(logs.String(), "the rest of SHUTDOWN_DELAY is skipped") {
		t.Errorf("the log does not say the delay was cut short:\n%s", logs.String())
	}
	if _, err := client.Get("http://" + addr + "/healthz"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after serve returned: %v, want connection refused", err)
	}
}

// TestStopSignalNamesTheSignal: the stop lines of serve, relay and consume
// name the signal that stopped them (SIGTERM from an orchestrator is
// "terminated"), and "none" when none did.
func TestStopSignalNamesTheSignal(t *testing.T) {
	t.Parallel()
	signals := make(chan os.Signal, 1)
	ctx, stop := shutdownOn(context.Background(), signals)
	defer stop()
	if got := stopSignal(ctx); got != "none" {
		t.Errorf("before any signal: %q, want none", got)
	}
	signals <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not end the context")
	}
	if got := stopSignal(ctx); got != "terminated" {
		t.Errorf("after SIGTERM: %q, want terminated", got)
	}
	if got := stopSignal(context.Background()); got != "none" {
		t.Errorf("a context no signal ends: %q, want none", got)
	}
}

// TestPlannedDrainLogsNoWarning stops serve as an orchestrator does, its
// load balancer asking /readyz all through SHUTDOWN_DELAY, and reads its log:
// a planned drain is no failure, so from start to stop serve writes nothing
// at WARN or above, its relay included. /readyz's 503 shutting-down is the
// drain itself, which serve announces at INFO.
func TestPlannedDrainLogsNoWarning(t *testing.T) {
	env := envOf(map[string]string{"DATABASE_URL": pgtest.NewDatabase(t), "HTTP_ADDR": "127.0.0.1:0",
		"METRICS_ADDR": "off", "NATS_URL": testkit.StartNATS(t).URL(), "RELAY_POLL": "100ms",
		"SHUTDOWN_DELAY": "1s", "SHUTDOWN_TIMEOUT": "5s"})
	logs := &testkit.LogBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, io.Discard, logs) }()
	addr := waitForAddr(t, logs)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	probe := func() int {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0 // the listener has closed
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := probe(); got != http.StatusOK {
		t.Fatalf("before the stop: /readyz %d, want 200", got)
	}

	stop() // SIGTERM
	seen := map[int]int{}
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("serve returned %v", err)
			}
			if seen[http.StatusServiceUnavailable] == 0 {
				t.Errorf("/readyz during the drain: %v, never 503", seen)
			}
			lines := testkit.JSONLog(t, logs.String(), "")
			if loud := testkit.Where(lines, "level", "WARN", "ERROR"); len(loud) > 0 {
				t.Errorf("a planned drain logged %d lines at WARN or above, want none: %v", len(loud), loud)
			}
			if len(testkit.Where(lines, "msg", "stopped")) != 1 {
				t.Errorf("serve did not log its stop:\n%s", logs.String())
			}
			return
		case <-time.After(20 * time.Millisecond):
			seen[probe()]++
		}
	}
}
