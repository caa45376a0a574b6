package idempotency

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments/internal/retry"
)

// Expirer deletes expired keys; *postgres.Store implements it.
type Expirer interface {
	// DeleteExpiredKeys deletes up to batch keys older than ttl, reporting
	// ran=false when another janitor holds the lock.
	DeleteExpiredKeys(ctx context.Context, ttl time.Duration, batch int) (deleted int64, ran bool, err error)
}

// Janitor deletes keys past their retention in bounded batches, one janitor at
// a time across replicas, pausing between batches so live traffic keeps the
// database.
type Janitor struct {
	store    Expirer
	log      *slog.Logger
	ttl      time.Duration
	interval time.Duration
	batch    int
	pause    time.Duration
	deleted  atomic.Int64
	caughtUp atomic.Int64 // unix seconds of the last sweep that left no expired key
}

// NewJanitor returns a janitor deleting keys older than ttl every interval, in
// batches of batch rows with pause between them.
func NewJanitor(store Expirer, log *slog.Logger, ttl, interval time.Duration, batch int, pause time.Duration) *Janitor {
	return &Janitor{store: store, log: log, ttl: ttl, interval: interval, batch: batch, pause: pause}
}

// Run sweeps every interval until ctx ends. A sweep that fails is tried
// again with the service's backoff for periodic work (retry.Periodic: within
// an interval at first, then up to four intervals apart) until one succeeds,
// and the failures are logged as one outage ("janitor: delete expired keys":
// down, still down once a minute, up), not once per attempt.
func (j *Janitor) Run(ctx context.Context) {
	loop := retry.NewLoop(j.log, "janitor: delete expired keys", retry.Periodic(j.interval))
	for {
		if _, err := j.Sweep(ctx); err != nil && ctx.Err() == nil {
			if !loop.Fail(ctx, err) {
				return
			}
			continue
		}
		loop.Succeed()
		if !retry.Sleep(ctx, j.interval) {
			return
		}
	}
}

// Sweep deletes every expired key, batch by batch, and returns how many it
// deleted, and the error that stopped it, if any (Run logs it). It stops
// early, without an error, if another janitor is at work or ctx ends.
func (j *Janitor) Sweep(ctx context.Context) (int64, error) {
	var total int64
	var err error
	for ctx.Err() == nil {
		var n int64
		var ran bool
		n, ran, err = j.store.DeleteExpiredKeys(ctx, j.ttl, j.batch)
		if err != nil {
			if ctx.Err() != nil {
				err = nil // stopped, not failed
			}
			break
		}
		total += n
		j.deleted.Add(n)
		if !ran {
			break
		}
		if n < int64(j.batch) {
			j.caughtUp.Store(time.Now().Unix())
			break
		}
		if !retry.Sleep(ctx, j.pause) {
			break
		}
	}
	if total > 0 {
		j.log.Info("janitor: expired idempotency keys deleted", "deleted", total)
	}
	return total, err
}

// CaughtUp reports when a sweep of this janitor last left no expired key;
// zero if none has. A janitor that stands aside for another never catches up.
func (j *Janitor) CaughtUp() time.Time {
	if s := j.caughtUp.Load(); s != 0 {
		return time.Unix(s, 0)
	}
	return time.Time{}
}

// Deleted reports how many keys this janitor has deleted.
func (j *Janitor) Deleted() int64 { return j.deleted.Load() }
