package client

import (
	"context"
	"fmt"
	"time"
)

// How WaitForCharge polls: first after the answer's Retry-After (at least
// waitFirst), then doubling up to waitMax.
const (
	waitFirst = 500 * time.Millisecond
	waitMax   = 10 * time.Second
)

// Settled reports whether a charge has reached a state the service will not
// move it from by itself: every status but processing and reversing.
// requires_review is settled in this sense: an operator resolves it, which
// may take days.
func (s ChargeStatus) Settled() bool {
	return s != ChargeStatusProcessing && s != ChargeStatusReversing
}

// WaitForCharge follows a charge until it is Settled, reading it (GET
// /v1/charges/{id}) first after res.RetryAfter, then at doubling intervals
// up to 10 s, and returns the last reading. res is what CreateCharge (or a
// GetCharge) returned; a res already settled is returned as it is. It stops
// at ctx's end with ctx's error and the last reading; a read that fails is
// returned with its error (a *Problem, a *RetryError).
//
// A card charge's outcome may take as long as the processor's decision
// deadline and the service's recovery (minutes, not seconds): give ctx the
// time you are ready to wait, and rely on the charge's events or a later
// GetCharge beyond it.
func (c *Client) WaitForCharge(ctx context.Context, res *Result[Charge]) (*Result[Charge], error) {
	if res == nil {
		return nil, fmt.Errorf("payments: WaitForCharge needs the result of CreateCharge or GetCharge")
	}
	wait := max(res.RetryAfter, waitFirst)
	for !res.Data.Status.Settled() {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, ctx.Err()
		case <-t.C:
		}
		next, err := c.GetCharge(ctx, res.Data.ID)
		if err != nil {
			return res, err
		}
		res = next
		wait = min(max(2*wait, res.RetryAfter), waitMax)
	}
	return res, nil
}
