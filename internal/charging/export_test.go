package charging

import (
	"context"
	"sync"
	"time"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
)

// BatchAnswer is one member's answer to RunChargeBatch: its result, or that
// it left the batch because its key was in flight or its account busy.
type BatchAnswer struct {
	Result         idempotency.Result
	Err            error
	InFlight, Busy bool
}

// RunChargeBatch runs reqs as exactly one batch, as the group commit would
// after gathering them (split in halves if a member's statement fails). The
// members that leave it are only reported, not run: see RunChargeAlone.
func (s *Path) RunChargeBatch(ctx context.Context, reqs []chargedb.KeyedCharge) ([]BatchAnswer, error) {
	answers, err := s.chargeBatch(ctx, reqs, chargedb.Waits{})
	out := make([]BatchAnswer, len(answers))
	for i, a := range answers {
		out[i] = BatchAnswer{a.res, a.err, a.inFlight, a.busy}
	}
	return out, err
}

// RunChargeAlone runs req as a member that left its batch does: alone,
// waiting up to KeyWait for its key and its account.
func (s *Path) RunChargeAlone(ctx context.Context, req chargedb.KeyedCharge) (idempotency.Result, error) {
	return s.chargeAlone(ctx, req, time.Now().Add(s.opts.KeyWait))
}

// StallChargeBatches makes every charge batch wait for release before it
// runs, as a batcher that stopped making progress would.
func (s *Path) StallChargeBatches() (release func()) {
	stall := make(chan struct{})
	s.charges = s.newChargeBatcher(func(ctx context.Context, reqs []chargedb.KeyedCharge) ([]chargeAnswer, error) {
		<-stall
		return s.runBatch(ctx, reqs)
	})
	var once sync.Once
	return func() { once.Do(func() { close(stall) }) }
}

// SkewClock makes this process's clock read d off the real one, as a host
// whose clock differs from the database's; call it before any charge.
func (s *Path) SkewClock(d time.Duration) {
	s.clock.localNow = func() time.Time { return time.Now().Add(d) }
}
