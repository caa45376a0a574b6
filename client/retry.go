package client

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryPolicy bounds the retries of one operation. The zero value of a field
// takes the DefaultRetryPolicy's.
type RetryPolicy struct {
	// MaxAttempts caps the requests sent for one operation, the first included.
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt; it doubles with each
	// further attempt, up to MaxDelay. The wait is drawn uniformly from zero to
	// that bound (full jitter), so clients that failed together spread out.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// MaxElapsed caps the time from the first attempt to the last: a retry
	// that could not start within it is not sent.
	MaxElapsed time.Duration
}

// DefaultRetryPolicy is the policy of a Client made without WithRetryPolicy:
// up to 6 attempts within 30 seconds, backing off from 100 ms to 5 s.
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts: 6,
	BaseDelay:   100 * time.Millisecond,
	MaxDelay:    5 * time.Second,
	MaxElapsed:  30 * time.Second,
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy
	if p.MaxAttempts > 0 {
		d.MaxAttempts = p.MaxAttempts
	}
	if p.BaseDelay > 0 {
		d.BaseDelay = p.BaseDelay
	}
	if p.MaxDelay > 0 {
		d.MaxDelay = p.MaxDelay
	}
	if p.MaxElapsed > 0 {
		d.MaxElapsed = p.MaxElapsed
	}
	return d
}

// backoff returns the wait before attempt n+1 after n attempts (n >= 1): full
// jitter over an exponential bound, and never less than the server's
// Retry-After.
func (p RetryPolicy) backoff(n int, retryAfter time.Duration) time.Duration {
	bound := p.MaxDelay
	if n-1 < 32 {
		if b := p.BaseDelay << (n - 1); b > 0 && b < bound {
			bound = b
		}
	}
	d := time.Duration(rand.Int64N(int64(bound) + 1)) //nolint:gosec // G404: jitter spreads load; it guards no secret
	return max(d, retryAfter)
}

// retryable says whether an answer may be retried with the same key: the
// request did not execute (409 in use, 429), or failed without storing
// anything (5xx). Every other 4xx would get the same answer again.
func retryable(status int, code string) bool {
	switch status {
	case http.StatusConflict:
		return code == CodeKeyInUse
	case http.StatusTooManyRequests:
		return true
	default:
		return status >= 500
	}
}

// parseRetryAfter reads a Retry-After header: delay-seconds, or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(min(s, 3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
