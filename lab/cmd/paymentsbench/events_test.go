package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// The event watch counts the charge events made during the run, each with
// its delay from created_at to arrival, and no event from before or after.
// The server is a real nats-server of the test's own, started as make bench
// starts the run's; without nats-server on PATH the test fails.
func TestEventWatchCountsTheRunsEvents(t *testing.T) {
	t.Setenv("NATS_URL", "") // StartNATS sets it; the test's end restores it
	n, err := benchrun.StartNATS(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	w, err := watchEvents(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	send := func(subject string, createdAt time.Time) {
		body := fmt.Sprintf(`{"id":"evt_x","object":"event","type":"charge.succeeded","created_at":%q,"data":{}}`,
			createdAt.UTC().Format(time.RFC3339Nano))
		if err := pub.Publish(subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	send("payments.charge.succeeded", start.Add(-time.Second)) // before the run
	w.start(start)
	send("payments.charge.succeeded", time.Now())
	send("payments.charge.failed", time.Now())
	send("payments.account.created", time.Now()) // not a charge's
	if err := pub.Publish("payments.charge.succeeded", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	send("payments.charge.succeeded", end.Add(time.Second)) // after the run
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	// finish returns once the run's 2 events are in, which may be before
	// the watch has handled the messages sent after them: wait until the
	// last one, the event after the run, has arrived (NATS delivers one
	// connection's messages in order), so that the count of messages that
	// are not events is final. It failed in CI once with 0 for that reason.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		w.mu.Lock()
		arrived := len(w.seen)
		w.mu.Unlock()
		if arrived == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events after the run's start arrived, want 3 (two in it, one after it)", arrived)
		}
	}
	h := w.finish(end, 2, 2*time.Second)
	if h.n != 2 {
		t.Fatalf("%d events counted, want the run's 2 charge events", h.n)
	}
	if h.max > 2*time.Second {
		t.Errorf("largest delay %s, want under the test's own length", h.max)
	}
	if w.bad != 1 {
		t.Errorf("%d messages not events, want 1", w.bad)
	}
}
