package charging

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments/internal/retry"
)

// HoldExpirer writes down the expiry of authorizations past their
// expires_at; *postgres.Holds implements it.
type HoldExpirer interface {
	// ExpireHolds records the expiry of at most batch expired holds, with
	// their events, reporting ran=false when another sweep holds the lock.
	ExpireHolds(ctx context.Context, batch int) (expired int64, ran bool, err error)
}

// ExpirySweep records the expiry of authorizations, in batches, one sweep at
// a time across replicas (like the key janitor). It decides nothing: an
// authorization past its expires_at holds nothing for every read and every
// decision from that instant (payment/authorize.go); the sweep writes the
// 'expired' state, releases the account's held amount, and emits
// charge.expired.
type ExpirySweep struct {
	store    HoldExpirer
	log      *slog.Logger
	interval time.Duration
	batch    int
	expired  atomic.Int64
}

// ExpiryPause is the sweep's pause between two full batches. Each batch
// writes a charge.expired event per hold, and the relay publishes every
// merchant's events in one order: a sweep writing them faster than the
// relay publishes would put every other merchant's events behind a queue of
// one account's expiries (200,000 holds expiring at one moment did, by up
// to a second). Paced, a batch of 500 in tens of milliseconds then 100 ms
// of rest, it writes at most about 4,000 a second, well within the relay's
// pace, so others' events wait for one batch at most. Nothing waits for the
// sweep: an authorization past its expires_at holds nothing for every read
// and decision already.
const ExpiryPause = 100 * time.Millisecond

// NewExpirySweep returns a sweep running every interval, batch holds at a
// time.
func NewExpirySweep(store HoldExpirer, log *slog.Logger, interval time.Duration, batch int) *ExpirySweep {
	return &ExpirySweep{store: store, log: log, interval: interval, batch: batch}
}

// Run sweeps every interval until ctx ends; failures are retried with the
// service's backoff for periodic work and logged as one outage.
func (e *ExpirySweep) Run(ctx context.Context) {
	loop := retry.NewLoop(e.log, "expiry: record expired authorizations", retry.Periodic(e.interval))
	for {
		if _, err := e.Sweep(ctx); err != nil && ctx.Err() == nil {
			if !loop.Fail(ctx, err) {
				return
			}
			continue
		}
		loop.Succeed()
		if !retry.Sleep(ctx, e.interval) {
			return
		}
	}
}

// Sweep records every expired hold, batch by batch with ExpiryPause between
// them, and returns how many. It stops early, without an error, when
// another sweep is at work or ctx ends.
func (e *ExpirySweep) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		n, ran, err := e.store.ExpireHolds(ctx, e.batch)
		if err != nil {
			if ctx.Err() != nil {
				err = nil
			}
			return total, err
		}
		total += n
		e.expired.Add(n)
		if !ran || n < int64(e.batch) || !retry.Sleep(ctx, ExpiryPause) {
			break
		}
	}
	if total > 0 {
		e.log.Info("expiry: authorizations expired", "expired", total)
	}
	return total, nil
}

// Expired reports how many expiries this sweep has recorded.
func (e *ExpirySweep) Expired() int64 { return e.expired.Load() }
