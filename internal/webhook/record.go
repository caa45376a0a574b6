package webhook

import (
	"context"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// recordFor is how long a Deliverer tries to record an attempt it made
// while the database fails: longer than a failover takes, so that one loses
// no attempt from the record. Meanwhile the attempt holds its slot.
const recordFor = time.Minute

// recordBatch bounds the attempts recorded in one transaction.
const recordBatch = 256

// toRecord is an attempt for the recorder, and where to say what became of
// it.
type toRecord struct {
	outcome payment.WebhookOutcome
	done    chan<- recordedAs
}

// recordedAs is the delivery's state after its attempt was recorded, or
// why it could not be.
type recordedAs struct {
	state string
	err   error
}

// recordLoop records the attempts it receives until in closes: all those
// waiting at once in one transaction (up to recordBatch), so that
// deliveries at the charge rate cost the database a commit per batch and
// not per attempt, and an attempt waits for one transaction at most.
func (d *Deliverer) recordLoop(ctx context.Context, in <-chan toRecord) {
	var batch []toRecord
	for first := range in {
		batch = append(batch[:0], first)
	more:
		for len(batch) < recordBatch {
			select {
			case r, ok := <-in:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		outcomes := make([]payment.WebhookOutcome, len(batch))
		for i, r := range batch {
			outcomes[i] = r.outcome
		}
		states, err := d.record(ctx, outcomes)
		for i, r := range batch {
			if err != nil {
				r.done <- recordedAs{err: err}
			} else {
				r.done <- recordedAs{state: states[i]}
			}
		}
	}
}

// record records the attempts, even if ctx ends meanwhile (they were made),
// trying again with the service's backoff while the store fails, for
// recordFor or until ctx ends. Each failure is logged as part of one
// outage. The attempts' IDs make a repeat after a lost answer harmless.
func (d *Deliverer) record(ctx context.Context, outcomes []payment.WebhookOutcome) ([]string, error) {
	deadline := time.Now().Add(recordFor)
	for try := 0; ; try++ {
		recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		states, err := d.store.RecordAttempts(recordCtx, outcomes)
		cancel()
		if err == nil {
			d.records.Succeeded()
			return states, nil
		}
		d.records.Failed(err)
		wait := retry.Default.Wait(try)
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}
