package retry

import (
	"context"
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
//
// A process runs many such loops, and when its database goes away they all
// fail at once. Outages whose logger comes from SharedOutages tell that as
// one story at WARN: at most one "down" line a Remind is WARN (the first
// loop to fail; the others that fail with it are INFO), and at most one
// reminder a Remind, whichever loop's is due first; every line counts the
// process's outages under way ("outages"). An outage of N minutes is then
// about N WARN lines for the whole process however many loops it has, and
// each loop's own story (down, still down, up) is still all there, at INFO
// where another line already warned.
type Outage struct {
	log    *slog.Logger
	msg    string
	now    func() time.Time // time.Now; tests set another clock
	shared *shared          // the process's outages, when log comes from SharedOutages

	mu       sync.Mutex
	since    time.Time // the first failure of the outage; zero while up
	logged   time.Time // the last line about it
	attempts int       // failed attempts since
}

// NewOutage returns the outage log of the loop or check that msg names
// (e.g. "relay: publish events"), writing to log. When log's handler comes
// from SharedOutages, the outage warns as one of the process's.
func NewOutage(log *slog.Logger, msg string) *Outage {
	o := &Outage{log: log, msg: msg, now: time.Now}
	if h, ok := log.Handler().(*sharedHandler); ok {
		o.shared = h.shared
	}
	return o
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
		level, scope := o.shared.began(now)
		o.log.Log(context.Background(), level, o.msg, append(append([]any{"state", "down", "error", err}, scope...), attrs...)...)
		return true
	case now.Sub(o.logged) >= Remind:
		o.logged = now
		level, scope := o.shared.reminds(now)
		o.log.Log(context.Background(), level, o.msg, append(append([]any{"state", "still down", "error", err,
			"down_for", roundDuration(now.Sub(o.since)), "attempts", o.attempts}, scope...), attrs...)...)
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
	o.shared.ended()
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

// SharedOutages returns h carrying one record of the process's outages:
// every Outage (and Loop) whose logger is made from the returned handler, or
// from one derived from it with With or WithGroup, warns as one of the
// process's outages (see Outage). The service's commands log through one.
func SharedOutages(h slog.Handler) slog.Handler {
	return &sharedHandler{Handler: h, shared: &shared{}}
}

// sharedHandler is a handler that carries the process's record of outages
// to the Outages logging through it; it logs as the handler it wraps.
type sharedHandler struct {
	slog.Handler
	shared *shared
}

func (h *sharedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &sharedHandler{Handler: h.Handler.WithAttrs(attrs), shared: h.shared}
}

func (h *sharedHandler) WithGroup(name string) slog.Handler {
	return &sharedHandler{Handler: h.Handler.WithGroup(name), shared: h.shared}
}

// shared is what a process's outages know of each other: how many are under
// way, and when one last warned. Its methods take a nil receiver (an
// Outage on its own), which warns as it always did. An Outage calls them
// holding its own lock: the order is always the Outage's, then this one's.
type shared struct {
	mu         sync.Mutex
	down       int       // outages under way
	warnedDown time.Time // the last "down" line at WARN
	warned     time.Time // the last WARN line of any of them
}

// began counts an outage that begins at now, and returns the level of its
// "down" line and the attributes that say how many are under way. It is
// INFO when another outage under way went down at WARN less than a Remind
// ago: the same failure, most often, already told. A loop that finds it
// later, or a failure of its own long after, warns again.
func (s *shared) began(now time.Time) (slog.Level, []any) {
	if s == nil {
		return slog.LevelWarn, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down++
	level := slog.LevelInfo
	if s.down == 1 || now.Sub(s.warnedDown) >= Remind {
		level, s.warnedDown, s.warned = slog.LevelWarn, now, now
	}
	return level, []any{"outages", s.down}
}

// reminds returns the level of an outage's reminder at now, WARN if none of
// the process's outages has warned for a Remind, and the attributes that say
// how many are under way.
func (s *shared) reminds(now time.Time) (slog.Level, []any) {
	if s == nil {
		return slog.LevelWarn, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	level := slog.LevelInfo
	if now.Sub(s.warned) >= Remind {
		level, s.warned = slog.LevelWarn, now
	}
	return level, []any{"outages", s.down}
}

// ended counts an outage that is over.
func (s *shared) ended() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down--
}

// roundDuration renders d for a log line: "1m2.345s", not nanoseconds.
func roundDuration(d time.Duration) string { return d.Round(time.Millisecond).String() }
