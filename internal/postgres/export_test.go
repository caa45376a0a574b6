package postgres

import (
	"context"

	"payments/internal/idempotency"
)

// BatchAnswer is one member's answer to RunChargeBatch.
type BatchAnswer struct {
	Result   idempotency.Result
	Err      error
	InFlight bool
}

// RunChargeBatch runs reqs as exactly one batch, as the group commit would
// after gathering them.
func (s *Store) RunChargeBatch(ctx context.Context, reqs []ChargeRequest) ([]BatchAnswer, error) {
	answers, err := s.chargeBatch(ctx, reqs, false)
	out := make([]BatchAnswer, len(answers))
	for i, a := range answers {
		out[i] = BatchAnswer{a.res, a.err, a.inFlight}
	}
	return out, err
}
