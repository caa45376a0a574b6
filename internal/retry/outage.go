package retry

import (
	"log/slog"
	"sync"
	"time"
)

// Remind is how often an Outage that goes on is logged again.
const Remind = time.Minute

// Outage logs the failures of one loop or check as changes of state, each
// line with the loop's message and a "state" attribute: "down" at WARN with
// the error when it starts failing; "still down" at WARN at most once per
// Remind while it keeps failing, with how long and how many attempts; "up"
// at INFO, with the same, when it succeeds again. An outage of N minutes
// writes about N lines, however often it is tried. Its methods may be called
// from several goroutines.
type Outage struct {
	log *slog.Logger
	msg string
	now func() time.Time // time.Now; tests set another clock

	mu       sync.Mutex
	since    time.Time // the first failure of the outage; zero while up
	logged   time.Time // the last line about it
	attempts int       // failed attempts since
}

// NewOutage returns the outage log of the loop or check that msg names
// (e.g. "relay: publish events"), writing to log.
func NewOutage(log *slog.Logger, msg string) *Outage {
	return &Outage{log: log, msg: msg, now: time.Now}
}

// Failed records a failed attempt. It logs err when the attempt begins an
// outage, or when the last line about it is Remind old; attrs (key-value
// pairs, as slog takes them) are added to that line. It reports whether it
// logged.
func (o *Outage) Failed(err error, attrs ...any) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	o.attempts++
	switch {
	case o.since.IsZero():
		o.since, o.logged = now, now
		o.log.Warn(o.msg, append([]any{"state", "down", "error", err}, attrs...)...)
		return true
	case now.Sub(o.logged) >= Remind:
		o.logged = now
		o.log.Warn(o.msg, append([]any{"state", "still down", "error", err,
			"down_for", roundDuration(now.Sub(o.since)), "attempts", o.attempts}, attrs...)...)
		return true
	}
	return false
}

// Succeeded ends the outage under way, if any, and logs its end at INFO with
// how long it lasted and how many attempts failed; otherwise it does nothing.
func (o *Outage) Succeeded() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return
	}
	o.log.Info(o.msg, "state", "up", "down_for", roundDuration(o.now().Sub(o.since)), "attempts", o.attempts)
	o.since, o.logged, o.attempts = time.Time{}, time.Time{}, 0
}

// Retrying draws the wait after the attempt-th failure in a row by p, and
// logs it at DEBUG ("state": "retrying") under the outage's message, for a
// retry loop that another package runs (the NATS client's reconnects), whose
// failures are reported through Failed.
func (o *Outage) Retrying(p Policy, attempt int) time.Duration {
	ceiling := p.Ceiling(attempt)
	wait := jitter(ceiling)
	o.log.Debug(o.msg, "state", "retrying", "attempt", attempt,
		"retry_in", roundDuration(wait), "backoff_ceiling", roundDuration(ceiling))
	return wait
}

// Down reports whether an outage is under way: the last attempt failed.
func (o *Outage) Down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}

// roundDuration renders d for a log line: "1m2.345s", not nanoseconds.
func roundDuration(d time.Duration) string { return d.Round(time.Millisecond).String() }
