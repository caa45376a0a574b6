package charging

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// What happens to a charge that cannot be decided with its batch, and to one
// whose client leaves. A batch waits for no lock another transaction holds:
//
//   - A member whose key another transaction holds (a twin in flight on
//     another replica) leaves the batch without touching its account, and
//     waits for the key alone (chargeAlone), holding nothing.
//   - Members whose account row another transaction holds (another replica's
//     batch, an operator, a commit waiting for the standby) leave it too, one
//     busyGroup per account: the group waits for that row in one transaction,
//     on a goroutine of its own, and decides its members in their batch order.
//     Their batch-mates commit at once.
//
// Either waits at most IDEMPOTENCY_WAIT after its batch ended, then answers
// 409 idempotency-key-in-use (a key) or 503 (a row), like a lone request.
// Those waits hold pooled connections, so at most half the pool may wait at
// once (startWaiting); the batches always have connections left.

// busyGroup is the members of one batch whose account another transaction
// had locked, waiting together for that row.
type busyGroup struct {
	reqs     []chargedb.KeyedCharge
	deadline time.Time
	done     chan struct{}

	mu        sync.Mutex
	finished  bool
	answers   []chargeAnswer
	err       error
	abandoned []bool // by member: its client left before the group answered
}

// formBusyGroups gives the members of a batch that left it their deadline,
// and starts one busyGroup per account among the busy ones.
func (s *Path) formBusyGroups(reqs []chargedb.KeyedCharge, answers []chargeAnswer, deadline time.Time) {
	var groups map[chargedb.AccountKey]*busyGroup
	for i := range answers {
		a := &answers[i]
		if !a.left() {
			continue
		}
		a.deadline = deadline
		if !a.busy {
			continue
		}
		ak := reqs[i].Account()
		g := groups[ak]
		if g == nil {
			if groups == nil {
				groups = make(map[chargedb.AccountKey]*busyGroup)
			}
			g = &busyGroup{deadline: deadline, done: make(chan struct{})}
			groups[ak] = g
		}
		a.group, a.member = g, len(g.reqs)
		g.reqs = append(g.reqs, reqs[i])
		g.abandoned = append(g.abandoned, false)
	}
	for _, g := range groups {
		go s.runBusyGroup(g)
	}
}

// runBusyGroup runs g's members as one transaction that waits for their
// account, until g's deadline.
func (s *Path) runBusyGroup(g *busyGroup) {
	// The lock wait ends at the deadline (the store's lock_timeout); the
	// context is the backstop.
	ctx, cancel := context.WithDeadline(context.Background(), g.deadline.Add(time.Second))
	defer cancel()
	var answers []chargeAnswer
	release, err := s.startWaiting(ctx, g.deadline)
	if err == nil {
		answers, err = s.chargeBatch(ctx, g.reqs, chargedb.Waits{Accounts: true, Deadline: g.deadline})
		release()
	}
	for i := range answers {
		answers[i].deadline = g.deadline // a key in flight: it waits on alone
	}
	g.mu.Lock()
	g.finished, g.answers, g.err = true, answers, err
	var left []int
	for i, gone := range g.abandoned {
		if gone {
			left = append(left, i)
		}
	}
	g.mu.Unlock()
	close(g.done)
	for _, i := range left {
		ans, err := g.answer(i)
		s.reportAbandoned(g.reqs[i], ans, err)
	}
}

// wait returns member i's answer once g has it. If ctx ends first, the
// member is abandoned: errOutcomeUnknown now, its outcome reported later.
func (g *busyGroup) wait(ctx context.Context, i int) (chargeAnswer, error) {
	select {
	case <-g.done:
		return g.answer(i)
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished {
		return g.answer(i)
	}
	g.abandoned[i] = true
	return chargeAnswer{}, errOutcomeUnknown
}

// abandon marks member i as abandoned by a client that left before it
// learned of g: its outcome is reported when g has it.
func (s *Path) abandon(g *busyGroup, i int) {
	g.mu.Lock()
	if !g.finished {
		g.abandoned[i] = true
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	ans, err := g.answer(i)
	s.reportAbandoned(g.reqs[i], ans, err)
}

// answer is member i's answer; g must be finished (its answers no longer
// change).
func (g *busyGroup) answer(i int) (chargeAnswer, error) {
	if g.err != nil {
		return chargeAnswer{}, g.err
	}
	return g.answers[i], nil
}

// startWaiting takes one of the connections that members waiting alone may
// hold (Options.Waiters: half the pool), waiting for one until deadline. The caller calls
// release when its transaction is over.
func (s *Path) startWaiting(ctx context.Context, deadline time.Time) (release func(), err error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case s.waiters <- struct{}{}:
		return func() { <-s.waiters }, nil
	case <-t.C:
		return nil, fmt.Errorf("%w: too many charges wait for keys in flight or locked accounts", payment.ErrUnavailable)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// What became of a charge whose client left before it was answered
// (AbandonedCharge.Outcome).
const (
	AbandonedExecuted    = "executed"     // its response was stored: retries replay it
	AbandonedReplayed    = "replayed"     // answered from a response stored earlier
	AbandonedNotExecuted = "not_executed" // nothing was written for it
	AbandonedFailed      = "failed"       // an error: rolled back, or not confirmed by the standby
)

// AbandonedCharge is what became of a charge whose client left while it was
// queued or being decided; the client, if anyone still listens, was answered
// 503, and a retry with the key answers with the outcome.
type AbandonedCharge struct {
	Request idempotency.Request
	Outcome string // one of the Abandoned* constants
	Status  int    // the response's status, when executed or replayed
	Err     error  // the cause, when failed or not executed
}

// errNotExecuted marks the error of a charge that was never executed.
var errNotExecuted = errors.New("not executed")

// notExecuted reports whether a charge that ended with err certainly wrote
// nothing: it was refused for its key, or its context ended before its
// transaction committed (a commit runs on no request's context).
func notExecuted(err error) bool {
	return errors.Is(err, errNotExecuted) || errors.Is(err, idempotency.ErrKeyReused) ||
		errors.Is(err, idempotency.ErrKeyInUse) || errors.Is(err, context.Canceled)
}

// reportAbandoned tells Options.OnAbandoned what became of req, whose
// client has left; for a member of a busy group still waiting, that is once
// the group has answered.
func (s *Path) reportAbandoned(req chargedb.KeyedCharge, ans chargeAnswer, err error) {
	if ans.group != nil && err == nil {
		s.abandon(ans.group, ans.member)
		return
	}
	if s.opts.OnAbandoned == nil {
		return
	}
	a := AbandonedCharge{Request: req.Request}
	switch {
	case err != nil:
		a.Outcome, a.Err = AbandonedFailed, err
	case ans.inFlight:
		a.Outcome, a.Err = AbandonedNotExecuted, idempotency.ErrKeyInUse
	case ans.err != nil && notExecuted(ans.err):
		a.Outcome, a.Err = AbandonedNotExecuted, ans.err
	case ans.err != nil:
		a.Outcome, a.Err = AbandonedFailed, ans.err
	case ans.res.Replayed:
		a.Outcome, a.Status = AbandonedReplayed, ans.res.Status
	default:
		a.Outcome, a.Status = AbandonedExecuted, ans.res.Status
	}
	s.opts.OnAbandoned(a)
}
