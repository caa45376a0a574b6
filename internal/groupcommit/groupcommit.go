// Package groupcommit gathers concurrent requests into batches, so that many
// of them share one database transaction and pay for one commit (one WAL
// flush) between them.
//
// At most Concurrency batches run at a time, one per slot. A request that
// finds a slot free leaves at once, alone if need be: nothing ever waits on a
// timer for company. Requests that arrive while every slot is busy queue, and
// the first slot to free takes up to MaxSize of them as its next batch. So
// batches grow exactly as much as the database is slow to commit, and a lone
// client pays nothing.
//
// A request's caller may leave at any moment without harming anyone: a slot
// is given back whatever the callers' contexts do, a request that leaves the
// queue is never executed, and one whose batch has already left runs to the
// end and has its answer reported to Options.Abandoned. A queued request
// waits at most MaxWait for a slot. Stats shows the age of the oldest batch
// in flight, so a batch that stops making progress is seen.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Options bound a Batcher. Zero values take the defaults.
type Options[In, Out any] struct {
	// MaxSize is the most requests in one batch (default 64).
	MaxSize int
	// Concurrency is how many batches may run at once (default 1: a batch
	// leaves as soon as the previous one has committed; on the 2-core machine
	// of docs/benchmarks.md one batch in flight beat two by a third).
	Concurrency int
	// MaxWait bounds a request's wait in the queue for a slot (0: no bound).
	// Past it the request leaves the queue, never executed, and Do returns
	// ErrQueueTimeout. Once its batch has left, a request waits for it.
	MaxWait time.Duration
	// Abandoned, if set, receives the answer of each request whose caller
	// stopped waiting (Do returned ErrAbandoned) after its batch had left. It
	// runs on the batch's goroutine once the batch has answered.
	Abandoned func(in In, out Out, err error)
}

// Run executes one batch. It must answer every item: outs[i] is items[i]'s
// answer, and an error of the whole batch is reported for every item. ctx is
// the batch's own, not any one request's: a client that goes away does not
// cancel its neighbours.
type Run[In, Out any] func(ctx context.Context, items []In) ([]Out, error)

// Batcher runs requests in batches. It is safe for concurrent use.
type Batcher[In, Out any] struct {
	run  Run[In, Out]
	opts Options[In, Out]
	ctx  context.Context

	mu    sync.Mutex
	queue []*pending[In, Out]
	// slots holds, for each slot, when its current batch was taken (zero:
	// the slot is free). At most opts.Concurrency batches are in flight.
	slots []time.Time
	stats Stats // the counters; the gauges are computed by Stats
}

type pending[In, Out any] struct {
	in       In
	ctx      context.Context
	queuedAt time.Time
	done     chan struct{}

	// Guarded by Batcher.mu.
	taken     bool // its batch has left: it runs to the end
	finished  bool // out and err are its answer
	abandoned bool // its caller left after it was taken
	out       Out
	err       error
}

// New returns a batcher that executes batches with run. ctx bounds every
// batch's life: cancel it on shutdown, after the HTTP server has drained.
func New[In, Out any](ctx context.Context, run Run[In, Out], opts Options[In, Out]) *Batcher[In, Out] {
	if opts.MaxSize <= 0 {
		opts.MaxSize = 64
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	return &Batcher[In, Out]{run: run, opts: opts, ctx: ctx, slots: make([]time.Time, opts.Concurrency)}
}

var (
	// ErrPanicked is every member's answer when a batch panicked: nothing of
	// it committed.
	ErrPanicked = errors.New("groupcommit: the batch panicked")

	// ErrQueueTimeout is the answer of a request that waited MaxWait in the
	// queue without a batch taking it. It was not executed.
	ErrQueueTimeout = errors.New("groupcommit: no batch took the request within the queue's wait bound; it was not executed")

	// ErrAbandoned is the answer when the caller's context ended after the
	// request's batch had left. The request runs to the end; its answer goes
	// to Options.Abandoned.
	ErrAbandoned = errors.New("groupcommit: the caller left while its request's batch was running; the outcome is not known yet")
)

// Do submits in and waits for its answer. A request whose caller is already
// gone is not queued. If ctx ends while in is queued, in leaves the queue,
// never executed, and Do returns ctx's error; if it ends once in's batch has
// left, Do returns ErrAbandoned at once and the batch runs on. A request
// queued for MaxWait returns ErrQueueTimeout, never executed. A request that
// finds a slot free runs its batch (of itself alone) on the caller's
// goroutine: a lone client pays for no hand-over.
func (b *Batcher[In, Out]) Do(ctx context.Context, in In) (Out, error) {
	var zero Out
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	p := &pending[In, Out]{in: in, ctx: ctx, queuedAt: time.Now(), done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	slot, batch := -1, []*pending[In, Out](nil)
	if i := slices.Index(b.slots, time.Time{}); i >= 0 {
		// The queue was empty (a slot frees only when it is), so the batch
		// is p alone, or nothing if p's caller left meanwhile.
		if batch = b.takeLocked(); batch != nil {
			slot, b.slots[i] = i, time.Now()
		}
	}
	b.mu.Unlock()
	if batch != nil {
		b.execute(batch)
		if next := b.next(slot); next != nil {
			go b.loop(slot, next)
		}
	}

	var timeout <-chan time.Time
	if b.opts.MaxWait > 0 {
		t := time.NewTimer(b.opts.MaxWait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case <-p.done:
			return p.out, p.err
		case <-ctx.Done():
			b.mu.Lock()
			defer b.mu.Unlock()
			switch {
			case p.finished:
				return p.out, p.err
			case !p.taken:
				b.removeLocked(p)
				return zero, ctx.Err()
			}
			p.abandoned = true
			b.stats.Abandoned++
			return zero, ErrAbandoned
		case <-timeout:
			b.mu.Lock()
			if !p.taken {
				b.removeLocked(p)
				b.stats.QueueTimeouts++
				b.mu.Unlock()
				return zero, ErrQueueTimeout
			}
			b.mu.Unlock()
			timeout = nil // its batch has left: wait for it
		}
	}
}

// takeLocked removes the next batch from the queue, skipping requests whose
// callers have gone. It returns nil when nothing is left.
func (b *Batcher[In, Out]) takeLocked() []*pending[In, Out] {
	var batch []*pending[In, Out]
	i := 0
	for ; i < len(b.queue) && len(batch) < b.opts.MaxSize; i++ {
		if p := b.queue[i]; p.ctx.Err() == nil {
			p.taken = true
			batch = append(batch, p)
		}
	}
	b.queue = b.queue[i:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// removeLocked takes p out of the queue, if it is still there.
func (b *Batcher[In, Out]) removeLocked(p *pending[In, Out]) {
	if i := slices.Index(b.queue, p); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
}

// loop runs batches in one slot until the queue is empty.
func (b *Batcher[In, Out]) loop(slot int, batch []*pending[In, Out]) {
	for batch != nil {
		b.execute(batch)
		batch = b.next(slot)
	}
}

// next takes the next batch for a slot whose batch has finished, or frees
// the slot when nothing waits.
func (b *Batcher[In, Out]) next(slot int) []*pending[In, Out] {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := b.takeLocked()
	if batch == nil {
		b.slots[slot] = time.Time{}
	} else {
		b.slots[slot] = time.Now()
	}
	return batch
}

// execute runs one batch and answers its members: each waiting caller, and
// Options.Abandoned for each caller that left.
func (b *Batcher[In, Out]) execute(batch []*pending[In, Out]) {
	items := make([]In, len(batch))
	for i, p := range batch {
		items[i] = p.in
	}
	outs, err := b.call(items)
	if err == nil && len(outs) != len(batch) {
		err = fmt.Errorf("groupcommit: %d answers for %d requests", len(outs), len(batch))
	}
	var abandoned []*pending[In, Out]
	b.mu.Lock()
	b.stats.Batches++
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.out = outs[i]
		}
		p.finished = true
		if p.abandoned {
			abandoned = append(abandoned, p)
		}
	}
	b.mu.Unlock()
	for _, p := range batch {
		close(p.done)
	}
	if b.opts.Abandoned != nil {
		for _, p := range abandoned {
			b.opts.Abandoned(p.in, p.out, p.err)
		}
	}
}

// call runs the batch, turning a panic into every member's ErrPanicked.
func (b *Batcher[In, Out]) call(items []In) (outs []Out, err error) {
	defer func() {
		if r := recover(); r != nil {
			outs, err = nil, fmt.Errorf("%w: %v", ErrPanicked, r)
		}
	}()
	return b.run(b.ctx, items)
}

// Stats describes a batcher at one moment.
type Stats struct {
	// Queued is how many requests wait for a slot, and QueueWait how long the
	// oldest of them has waited (0: none waits).
	Queued    int
	QueueWait time.Duration
	// BatchAge is how long the oldest batch in flight has run (0: none
	// runs). A batch whose every wait is bounded never grows older than its
	// bounds; past them, the batcher is stuck.
	BatchAge time.Duration
	// Batches counts the batches run; QueueTimeouts the requests that left
	// the queue after MaxWait; Abandoned the requests whose callers left
	// after their batch had left.
	Batches, QueueTimeouts, Abandoned uint64
}

// Stats returns the batcher's statistics. It never waits for a batch.
func (b *Batcher[In, Out]) Stats() Stats {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.stats
	st.Queued = len(b.queue)
	if len(b.queue) > 0 {
		st.QueueWait = now.Sub(b.queue[0].queuedAt)
	}
	for _, at := range b.slots {
		if !at.IsZero() {
			st.BatchAge = max(st.BatchAge, now.Sub(at))
		}
	}
	return st
}
