package relay_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/relay"
)

// recorder is a relay.Observer that keeps what it is told.
type recorder struct {
	mu        sync.Mutex
	batches   []int
	latencies []time.Duration
	failures  map[string]int
}

func (r *recorder) Batch(n int) { r.mu.Lock(); r.batches = append(r.batches, n); r.mu.Unlock() }
func (r *recorder) Published(d time.Duration) {
	r.mu.Lock()
	r.latencies = append(r.latencies, d)
	r.mu.Unlock()
}
func (r *recorder) Failed(reason string) { r.mu.Lock(); r.failures[reason]++; r.mu.Unlock() }

// seen returns the events in the batches, the latencies and the failures so far.
func (r *recorder) seen() (batched int, latencies []time.Duration, failures map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.batches {
		batched += n
	}
	failures = map[string]int{}
	for k, v := range r.failures {
		failures[k] = v
	}
	return batched, append([]time.Duration(nil), r.latencies...), failures
}

// TestObserverSeesBatchesLatencyAndRefusals: the relay tells its observer
// each event the broker stored, timed from the event's created_at (here 10
// minutes back), the events of each round, and a round the broker refused
// (an event over the stream's MaxMsgSize), as "refused" and nothing else.
func TestObserverSeesBatchesLatencyAndRefusals(t *testing.T) {
	e := setup(t)
	js := e.jetStream()
	cfg := jetstream.StreamConfig{Name: relay.Stream, Subjects: []string{relay.SubjectPrefix + ">"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, MaxMsgSize: 8 << 10}
	if _, err := js.CreateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	small := e.openAccount(payment.NewAccount{Currency: "USD"})
	e.deposit(small, 100)
	e.deposit(small, 200)
	big := payment.NewAccount{Currency: "USD", Description: new(strings.Repeat("d", payment.MaxDescriptionLength)), Metadata: map[string]string{}}
	for i := range 20 { // over 11 KB of event
		big.Metadata["key"+strconv.Itoa(i)] = strings.Repeat("m", payment.MaxMetadataValueLen)
	}
	e.openAccount(big)
	const age = 10 * time.Minute
	if _, err := e.store.Pool().Exec(context.Background(), `UPDATE events SET created_at = created_at - $1::interval`, age); err != nil {
		t.Fatal(err)
	}
	e.waitUntil("every event is readable by the relay", func() bool { return e.readable() == 4 })

	obs := &recorder{failures: map[string]int{}}
	r, err := relay.New(e.store, e.nats.Connect(), e.log, relay.Options{Poll: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	e.waitUntil("the big event is refused", func() bool { _, _, f := obs.seen(); return f[relay.FailRefused] >= 1 })
	batched, latencies, _ := obs.seen()
	if batched != 3 || len(latencies) != 3 {
		t.Errorf("before the refused event: %d events in batches, %d latencies; want 3 and 3", batched, len(latencies))
	}
	cfg.MaxMsgSize = -1
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	e.waitUntil("the outbox is drained", e.drained)
	e.waitUntil("the last event is observed", func() bool { _, l, _ := obs.seen(); return len(l) == 4 })
	batched, latencies, failures := obs.seen()
	if batched != 4 || r.Stats.Published.Load() != 4 {
		t.Errorf("%d events in batches, %d published; want 4 and 4", batched, r.Stats.Published.Load())
	}
	for i, d := range latencies {
		if d < age {
			t.Errorf("event %d: %s from commit to publish, want at least %s (its created_at is that old)", i, d, age)
		}
	}
	if len(failures) != 1 || failures[relay.FailRefused] < 1 {
		t.Errorf("failures %v, want only %q", failures, relay.FailRefused)
	}
}
