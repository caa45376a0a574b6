// Package retry is how the service's background loops wait out a failure
// and how they log it: one backoff (exponential, full jitter, a cap, reset
// only after a success) and one log of state changes (down, still down once a
// minute, up again) rather than of attempts. Every retry loop of the service
// uses it (the relay, the janitor, the samplers, the expiry sweep, webhook
// delivery, card charge recovery, the consumer, the NATS connection), /readyz
// logs its answers through Outage, and a process's loops failing together
// warn as one (SharedOutages).
//
// It is written here rather than taken from github.com/cenkalti/backoff
// (already in the module graph, through testcontainers): that library jitters
// around the interval (±RandomizationFactor, so a wait can exceed its cap:
// "MaxInterval caps the RetryInterval and not the randomized interval") where
// this one draws the wait uniformly below a capped bound, and it has no log of
// state changes, which is most of this package. The backoff itself is a few
// lines, the same as the Go client's (client/retry.go).
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff with full jitter: the wait before retry n
// is drawn uniformly from [0, Ceiling(n)], where the ceiling doubles from
// First with each attempt up to Max. Loops that failed together spread out,
// and a long outage is tried about once per Max/2.
type Policy struct {
	First time.Duration // the ceiling of the first wait
	Max   time.Duration // the cap of every ceiling
}

// Default is the policy of the loops that wait for the database or NATS to
// come back (the relay, the consumer, the NATS connection): from 250 ms up to
// 5 s.
var Default = Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}

// Periodic is the policy of a loop that works every period (the janitor, the
// outbox sampler): after a failure it tries again within period at first,
// then less and less often, at most 4 periods apart.
func Periodic(period time.Duration) Policy {
	return Policy{First: period, Max: 4 * period}
}

// Ceiling is the bound of the wait after the attempt-th failure in a row
// (attempt >= 1): First·2^(attempt−1), capped at Max.
func (p Policy) Ceiling(attempt int) time.Duration {
	c := p.Max
	if n := attempt - 1; n >= 0 && n < 32 {
		if b := p.First << n; b > 0 && b < c {
			c = b
		}
	}
	return max(c, 0)
}

// Wait draws the wait after the attempt-th failure in a row: uniform in
// [0, Ceiling(attempt)].
func (p Policy) Wait(attempt int) time.Duration {
	return jitter(p.Ceiling(attempt))
}

func jitter(ceiling time.Duration) time.Duration {
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1)) //nolint:gosec // G404: jitter spreads load; it guards no secret
}

// Sleep waits d or until ctx ends, and reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
