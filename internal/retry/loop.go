package retry

import (
	"context"
	"log/slog"
)

// Loop is a retry loop's backoff and its Outage log together. One goroutine
// uses it:
//
//	for {
//		if err := work(ctx); err != nil {
//			if !loop.Fail(ctx, err) {
//				return // ctx ended
//			}
//			continue
//		}
//		loop.Succeed()
//		...
//	}
type Loop struct {
	policy  Policy
	outage  *Outage
	log     *slog.Logger
	attempt int // failures in a row
}

// NewLoop returns the loop that msg names (see NewOutage), backing off by p.
func NewLoop(log *slog.Logger, msg string, p Policy) *Loop {
	return &Loop{policy: p, outage: NewOutage(log, msg), log: log}
}

// Fail records err, logs it if it changes the loop's state (Outage.Failed,
// with the wait and its ceiling), and waits the next backoff or until ctx
// ends. It reports whether ctx is still live. Every wait is logged at DEBUG
// ("state": "retrying"), with the attempt, the wait and its ceiling.
func (l *Loop) Fail(ctx context.Context, err error) bool {
	l.attempt++
	ceiling := l.policy.Ceiling(l.attempt)
	wait := jitter(ceiling)
	timing := []any{"retry_in", roundDuration(wait), "backoff_ceiling", roundDuration(ceiling)}
	if !l.outage.Failed(err, timing...) {
		l.log.Debug(l.outage.msg, append([]any{"state", "retrying", "attempt", l.attempt, "error", err}, timing...)...)
	}
	return Sleep(ctx, wait)
}

// Succeed resets the backoff and ends the outage under way, logging its end.
func (l *Loop) Succeed() {
	l.attempt = 0
	l.outage.Succeeded()
}
