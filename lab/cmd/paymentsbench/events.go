package main

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// eventWatch measures how long events take to reach a NATS subscriber (with
// -events-url): for each charge event the relay publishes, the time from its
// transaction's start (the event's created_at, the database's clock on this
// machine) to its arrival here. That bounds commit-to-publish from above by
// the batch's own time before its commit.
type eventWatch struct {
	nc  *nats.Conn
	sub *nats.Subscription

	mu   sync.Mutex
	from time.Time // the measured run's start
	seen []arrival
	bad  int64 // messages that were not events
}

// arrival is one event's creation and its delay to this subscriber.
type arrival struct {
	createdAt time.Time
	delay     time.Duration
}

// watchEvents subscribes to the charge events on the NATS at url.
func watchEvents(url string) (*eventWatch, error) {
	nc, err := nats.Connect(url, nats.Name("paymentsbench"))
	if err != nil {
		return nil, fmt.Errorf("-events-url: %w", err)
	}
	w := &eventWatch{nc: nc}
	w.sub, err = nc.Subscribe("payments.charge.>", w.receive)
	if err == nil {
		err = w.sub.SetPendingLimits(-1, -1) // count every event, however late
	}
	if err == nil {
		err = nc.Flush() // the subscription is in place before the clock starts
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("-events-url: %w", err)
	}
	return w, nil
}

func (w *eventWatch) receive(m *nats.Msg) {
	now := time.Now()
	var e struct {
		CreatedAt time.Time `json:"created_at"`
	}
	err := json.Unmarshal(m.Data, &e)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil || e.CreatedAt.IsZero():
		w.bad++
	case w.from.IsZero() || e.CreatedAt.Before(w.from):
		// made before the measured run
	default:
		w.seen = append(w.seen, arrival{e.CreatedAt, now.Sub(e.CreatedAt)})
	}
}

// start marks the start of the measured run.
func (w *eventWatch) start(at time.Time) {
	w.mu.Lock()
	w.from = at
	w.mu.Unlock()
}

// finish waits until the events of the charges made in the run (want of
// them, the run ending at end) have arrived or grace has passed, and returns
// their delays.
func (w *eventWatch) finish(end time.Time, want int64, grace time.Duration) histogram {
	deadline := time.Now().Add(grace)
	for checked, n := 0, int64(0); ; {
		w.mu.Lock()
		for _, a := range w.seen[checked:] {
			if !a.createdAt.After(end) {
				n++
			}
		}
		checked = len(w.seen)
		w.mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = w.sub.Unsubscribe()
	w.nc.Close()
	var delays histogram
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.seen {
		if !a.createdAt.After(end) {
			delays.record(a.delay)
		}
	}
	return delays
}

// eventGrace bounds the wait after a run for the events of its last charges.
const eventGrace = 5 * time.Second
