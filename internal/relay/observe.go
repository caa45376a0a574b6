package relay

import "time"

// Observer is told what the relay does, for its metrics: internal/metrics
// implements it, and cmd/payments passes one in Options. Its methods are
// called from the relay's loop and must not block.
type Observer interface {
	// Batch records a publishing round: n events the broker acknowledged
	// (stored or recognised as duplicates), which one cursor write covers.
	Batch(n int)
	// Published records one event the broker stored, and how long after its
	// commit the acknowledgement came (sinceCommit, from the event's
	// created_at, its transaction's start: the outbox keeps no commit time).
	Published(sinceCommit time.Duration)
	// Failed records a round that did not publish all it had, and why: one of
	// FailureReasons.
	Failed(reason string)
}

// Why a publishing round failed, the values Observer.Failed receives.
const (
	// FailStream: the stream could not be looked up or created (NATS or
	// JetStream unreachable), so nothing was sent.
	FailStream = "stream"
	// FailSend: a message could not be sent.
	FailSend = "send"
	// FailRefused: the broker answered a message with an error (for example
	// a lost predecessor: the expected last message id did not match).
	FailRefused = "refused"
	// FailTimeout: no acknowledgement came within ackTimeout.
	FailTimeout = "timeout"
)

// FailureReasons lists every reason Observer.Failed receives, so that a
// metric can show each at 0 before the first failure.
var FailureReasons = []string{FailStream, FailSend, FailRefused, FailTimeout}

// sinceCommit is how long ago at was by this process's clock; never negative,
// as the database's clock (which wrote at) may run ahead of this one.
func sinceCommit(at time.Time) time.Duration {
	return max(time.Since(at), 0)
}

// noObserver records nothing: a relay without Options.Observer.
type noObserver struct{}

func (noObserver) Batch(int)               {}
func (noObserver) Published(time.Duration) {}
func (noObserver) Failed(string)           {}
