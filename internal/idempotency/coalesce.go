package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
)

// scope identifies a key: keys belong to a merchant.
type scope struct {
	merchant uuid.UUID
	key      string
}

func scopeOf(req Request) scope { return scope{req.MerchantID, req.Key} }

// Coalescer makes concurrent requests for one key inside this process share a
// single execution: the first becomes the leader and goes to the store; the
// others wait for its outcome instead of each holding a database connection
// while they queue on the key's index entry. The per-key state lives only
// while the leader runs, so the map cannot grow with the number of keys seen.
// The zero value is ready to use, with followers that wait as long as their
// leader runs.
type Coalescer struct {
	// Wait bounds a follower's wait for its leader, as the database bounds a
	// retry's wait for a twin on another replica: past it, the follower gets
	// ErrKeyInUse. Zero waits as long as the leader runs.
	Wait time.Duration

	mu    sync.Mutex
	calls map[scope]*call
}

// ErrLeaderPanicked is a follower's answer when the request it waited for
// panicked: nothing was stored, and the follower does not execute either.
var ErrLeaderPanicked = errors.New("the request being waited for failed unexpectedly")

type call struct {
	done        chan struct{}
	followers   int // guarded by Coalescer.mu
	fingerprint Fingerprint
	res         Result
	err         error
}

// Do runs exec for req unless a request with the same key is already running
// here, in which case it waits for that one and answers from its outcome: the
// same response marked as a replay, ErrKeyReused if req differs from it, or the
// same idempotency error. If the leader failed otherwise (an outage, a bug,
// its client went away), nothing was stored, and a follower runs exec itself.
// A follower waits at most c.Wait; a leader that panics answers its followers
// ErrLeaderPanicked and panics on.
func (c *Coalescer) Do(ctx context.Context, req Request, exec func(context.Context) (Result, error)) (Result, error) {
	s := scopeOf(req)
	c.mu.Lock()
	if c.calls == nil {
		c.calls = make(map[scope]*call)
	}
	if leader, ok := c.calls[s]; ok {
		leader.followers++
		c.mu.Unlock()
		var bound <-chan time.Time
		if c.Wait > 0 {
			t := time.NewTimer(c.Wait)
			defer t.Stop()
			bound = t.C
		}
		select {
		case <-leader.done:
		case <-bound:
			return Result{}, ErrKeyInUse
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
		if res, err, ok := leader.answerFor(req); ok {
			return res, err
		}
		return exec(ctx)
	}
	cl := &call{done: make(chan struct{}), fingerprint: req.Fingerprint}
	c.calls[s] = cl
	c.mu.Unlock()

	finished := false
	defer func() {
		if !finished {
			cl.res, cl.err = Result{}, ErrLeaderPanicked
		}
		c.mu.Lock()
		delete(c.calls, s)
		c.mu.Unlock()
		close(cl.done)
	}()
	cl.res, cl.err = exec(ctx)
	finished = true
	return cl.res, cl.err
}

// InFlight reports how many keys have a leader running, for tests and metrics.
func (c *Coalescer) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// answerFor derives a follower's answer from the leader's outcome, or reports
// false when the follower must execute by itself.
func (cl *call) answerFor(req Request) (Result, error, bool) {
	switch {
	case cl.err == nil && cl.fingerprint != req.Fingerprint:
		return Result{}, ErrKeyReused, true // the leader's request now owns the key
	case cl.err == nil:
		// Operation too: an answer from an operation still going on (a 202)
		// is no stored response, and its caller must know it.
		return Result{Response: cl.res.Response, Replayed: true, StoredAt: cl.res.StoredAt, Operation: cl.res.Operation}, nil, true
	case errors.Is(cl.err, ErrLeaderPanicked):
		return Result{}, cl.err, true
	case cl.fingerprint == req.Fingerprint && (errors.Is(cl.err, ErrKeyReused) || errors.Is(cl.err, ErrKeyInUse)):
		return Result{}, cl.err, true
	default:
		return Result{}, nil, false
	}
}
