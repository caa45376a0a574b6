// Package groupcommit gathers concurrent requests into batches, so that many
// of them share one database transaction and pay for one commit (one WAL
// flush) between them.
//
// At most Concurrency batches run at a time. A request that finds a free slot
// leaves at once, alone if need be: nothing ever waits on a timer for company.
// Requests that arrive while every slot is busy queue, and the first slot to
// free takes up to MaxSize of them as its next batch. So batches grow exactly
// as much as the database is slow to commit, and a lone client pays nothing.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Options bound a Batcher. Zero values take the defaults.
type Options struct {
	// MaxSize is the most requests in one batch (default 64).
	MaxSize int
	// Concurrency is how many batches may run at once (default 1: a batch
	// leaves as soon as the previous one has committed; on the 2-core machine
	// of docs/benchmarks.md one batch in flight beat two by a third).
	Concurrency int
}

// Run executes one batch. It must answer every item: outs[i] is items[i]'s
// answer, and an error of the whole batch is reported for every item. ctx is
// the batch's own, not any one request's: a client that goes away does not
// cancel its neighbours.
type Run[In, Out any] func(ctx context.Context, items []In) ([]Out, error)

// Batcher runs requests in batches. It is safe for concurrent use.
type Batcher[In, Out any] struct {
	run  Run[In, Out]
	opts Options
	ctx  context.Context

	mu      sync.Mutex
	queue   []*pending[In, Out]
	running int // batches in flight, at most opts.Concurrency
}

type pending[In, Out any] struct {
	in   In
	ctx  context.Context
	out  Out
	err  error
	done chan struct{}
}

// New returns a batcher that executes batches with run. ctx bounds every
// batch's life: cancel it on shutdown, after the HTTP server has drained.
func New[In, Out any](ctx context.Context, run Run[In, Out], opts Options) *Batcher[In, Out] {
	if opts.MaxSize <= 0 {
		opts.MaxSize = 64
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	return &Batcher[In, Out]{run: run, opts: opts, ctx: ctx}
}

// ErrPanicked is every member's answer when a batch panicked: nothing of it
// committed.
var ErrPanicked = errors.New("groupcommit: the batch panicked")

// Do submits in and waits for its answer. If ctx ends while in is still
// queued, in is dropped, never executed, and ctx's error returned; once its
// batch has left, in runs to the end even if ctx ends, and Do returns ctx's
// error without waiting. A request that finds a slot free runs its batch (of
// itself alone) on the caller's goroutine: a lone client pays for no
// hand-over.
func (b *Batcher[In, Out]) Do(ctx context.Context, in In) (Out, error) {
	p := &pending[In, Out]{in: in, ctx: ctx, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	var batch []*pending[In, Out]
	if b.running < b.opts.Concurrency {
		b.running++
		batch = b.takeLocked()
	}
	b.mu.Unlock()
	if batch != nil {
		b.execute(batch)
		if next := b.next(); next != nil {
			go b.loop(next)
		}
	}
	select {
	case <-p.done:
		return p.out, p.err
	case <-ctx.Done():
		var zero Out
		return zero, ctx.Err()
	}
}

// takeLocked removes the next batch from the queue, skipping requests whose
// callers have gone. It returns nil when nothing is left.
func (b *Batcher[In, Out]) takeLocked() []*pending[In, Out] {
	var batch []*pending[In, Out]
	i := 0
	for ; i < len(b.queue) && len(batch) < b.opts.MaxSize; i++ {
		if p := b.queue[i]; p.ctx.Err() == nil {
			batch = append(batch, p)
		}
	}
	b.queue = b.queue[i:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// loop runs batches in one slot until the queue is empty.
func (b *Batcher[In, Out]) loop(batch []*pending[In, Out]) {
	for batch != nil {
		b.execute(batch)
		batch = b.next()
	}
}

// next takes the next batch for a slot whose batch has finished, or frees
// the slot when nothing waits.
func (b *Batcher[In, Out]) next() []*pending[In, Out] {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := b.takeLocked()
	if batch == nil {
		b.running--
	}
	return batch
}

func (b *Batcher[In, Out]) execute(batch []*pending[In, Out]) {
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("%w: %v", ErrPanicked, r)
			for _, p := range batch {
				p.err = err
				close(p.done)
			}
		}
	}()
	items := make([]In, len(batch))
	for i, p := range batch {
		items[i] = p.in
	}
	outs, err := b.run(b.ctx, items)
	if err == nil && len(outs) != len(batch) {
		err = fmt.Errorf("groupcommit: %d answers for %d requests", len(outs), len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.out = outs[i]
		}
		close(p.done)
	}
}

// queued reports how many requests wait for a slot, for tests.
func (b *Batcher[In, Out]) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
