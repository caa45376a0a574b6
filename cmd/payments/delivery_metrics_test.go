package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/relay"
)

// TestRelayAndConsumeExportMetrics: payments relay and payments consume,
// started through run beside serve (its relay off), each answer /metrics and
// /healthz on their own METRICS_ADDR, with payments_build_info; the relay's
// publish counter, batch and commit-to-publish histograms count the events of
// an account, a deposit and then a charge, and the consumer counts them
// applied.
func TestRelayAndConsumeExportMetrics(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	for command, addr := range s.scrape {
		r, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusOK || string(body) != `{"status":"ok"}` {
			t.Errorf("%s: GET /healthz on METRICS_ADDR = %d %s", command, r.StatusCode, body)
		}
		if text := s.metrics(command); strings.Count(text, "payments_build_info{") != 1 {
			t.Errorf("%s exports payments_build_info %d times, want once", command, strings.Count(text, "payments_build_info{"))
		}
	}

	account := s.account(1000) // account.created, deposit.created
	// The relay counts an event published as its acknowledgement arrives,
	// and observes the batch after the last one: a scrape in between sees
	// them apart, so each is waited for.
	s.waitForValue("relay", "payments_relay_published_total", 2)
	s.waitForValue("relay", "payments_relay_commit_to_publish_seconds_count", 2)
	text := s.waitForValue("relay", "payments_relay_batch_events_sum", 2)
	for series, want := range map[string]float64{
		"payments_relay_commit_to_publish_seconds_count": 2,
		"payments_relay_batch_events_sum":                2,
		"payments_relay_leader":                          1,
		"payments_relay_duplicates_total":                0,
	} {
		if got, ok := sampleValue(text, series); !ok || got != want {
			t.Errorf("after 2 events, relay's %s = %v (present: %v), want %v", series, got, ok, want)
		}
	}
	for _, reason := range relay.FailureReasons {
		series := `payments_relay_publish_failures_total{reason="` + reason + `"}`
		if got, ok := sampleValue(text, series); !ok || got != 0 {
			t.Errorf("relay's %s = %v (present: %v), want 0", series, got, ok)
		}
	}
	// The relay's process exports the relay's series, not the API's.
	for _, name := range []string{"payments_http_request_duration_seconds", "payments_idempotency_outcomes_total", "payments_consumer_applied_total"} {
		if strings.Contains(text, name) {
			t.Errorf("the relay's /metrics has %s", name)
		}
	}
	batchesBefore, _ := sampleValue(text, "payments_relay_batch_events_count")

	if status := s.charge(account, uuid.NewString(), 250); status != http.StatusCreated {
		t.Fatalf("charge: %d", status)
	}
	text = s.waitForValue("relay", "payments_relay_published_total", 3)
	if got, _ := sampleValue(text, "payments_relay_commit_to_publish_seconds_count"); got != 3 {
		t.Errorf("after the charge, the commit-to-publish histogram counts %v events, want 3", got)
	}
	if got, _ := sampleValue(text, "payments_relay_batch_events_count"); got <= batchesBefore {
		t.Errorf("after the charge, %v publishing rounds, want more than %v", got, batchesBefore)
	}
	if sum, _ := sampleValue(text, "payments_relay_commit_to_publish_seconds_sum"); sum <= 0 {
		t.Errorf("commit-to-publish latencies add up to %v s, want more than 0", sum)
	}

	consumed := s.waitForValue("consume", "payments_consumer_applied_total", 3)
	for _, series := range []string{"payments_consumer_redelivered_total", `payments_consumer_failures_total{reason="apply"}`,
		`payments_consumer_failures_total{reason="unreadable"}`, `payments_consumer_failures_total{reason="receive"}`,
		`payments_consumer_failures_total{reason="ack"}`} {
		if got, ok := sampleValue(consumed, series); !ok || got != 0 {
			t.Errorf("consume's %s = %v (present: %v), want 0", series, got, ok)
		}
	}
	// serve runs no relay here: the relay's series are the relay process's.
	if served := s.metrics("serve"); strings.Contains(served, "payments_relay_") {
		t.Error("serve with RELAY_ENABLED=false exports relay series")
	}
}
