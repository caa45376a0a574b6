// Package relay delivers the outbox to NATS JetStream: it publishes committed
// events in order, each with Nats-Msg-Id set to the event id so the broker
// drops a republished duplicate, and moves the outbox's cursor past them.
//
// Delivery is at least once from the relay (an event published but not yet
// behind the cursor is published again after a crash) and effectively once downstream:
// JetStream drops the duplicate within its duplicate window, and consumers
// deduplicate by event id (see package consumer).
//
// One relay is active across all replicas: the one holding the outbox lease (a
// PostgreSQL advisory lock on a dedicated connection). The others stand by and
// take over when its connection ends.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// Stream is the JetStream stream the events go to; subjects are
// "payments.<event type>", e.g. payments.charge.succeeded. MerchantHeader
// carries the event's merchant id on each message. (The names are the
// domain's, so a consumer needs no relay to read them.)
const (
	Stream         = payment.EventStream
	SubjectPrefix  = payment.EventSubjectPrefix
	MerchantHeader = payment.EventMerchantHeader
)

// Options tune a Relay. Zero values take the defaults.
type Options struct {
	// Batch is the most events read and published in one round (default 100).
	Batch int
	// Poll is how long the leader waits for a notification before looking
	// anyway (default 1s), and how often a standby tries to take over.
	Poll time.Duration
	// Retention is how long after its creation a published event is kept
	// before pruning (default 30 days); PruneBatch bounds one delete
	// (default 1000).
	Retention  time.Duration
	PruneBatch int
	// MaxBackoff caps the wait between attempts while NATS or the database is
	// down (default 5s).
	MaxBackoff time.Duration
	// Observer is told what the relay publishes and what fails, for the
	// metrics (default: nothing is told).
	Observer Observer
}

func (o Options) withDefaults() Options {
	if o.Batch <= 0 {
		o.Batch = 100
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Retention <= 0 {
		o.Retention = 30 * 24 * time.Hour
	}
	if o.PruneBatch <= 0 {
		o.PruneBatch = 1000
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Second
	}
	return o
}

// Stats counts what a relay has done.
type Stats struct {
	Published  atomic.Int64 // events the broker stored
	Duplicates atomic.Int64 // events the broker already had (a republish)
	Pruned     atomic.Int64
	Leader     atomic.Bool
}

// Relay publishes the outbox.
type Relay struct {
	store payment.Outbox
	js    jetstream.JetStream
	log   *slog.Logger
	opts  Options
	Stats Stats

	// beforeMark, when set (by tests), runs after a batch is published and
	// before it is marked; an error stops the relay there, as a crash would.
	beforeMark func() error
}

// New returns a relay publishing store's outbox through nc.
func New(store payment.Outbox, nc *nats.Conn, log *slog.Logger, opts Options) (*Relay, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if opts.Observer == nil {
		opts.Observer = noObserver{}
	}
	return &Relay{store: store, js: js, log: log, opts: opts.withDefaults()}, nil
}

// Run relays until ctx ends: it stands by until it holds the outbox lease,
// then publishes. Outages of NATS or PostgreSQL are waited out with the
// service's backoff (internal/retry: exponential with full jitter from 250 ms
// up to MaxBackoff, reset only once a round succeeds) and logged as changes of
// state, not attempts; nothing is lost, events wait in the table. It returns
// nil when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	loop := retry.NewLoop(r.log, "relay: publish events", retry.Policy{First: retry.Default.First, Max: r.opts.MaxBackoff})
	for {
		err := r.lead(ctx, loop.Succeed)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errStopped):
			return err
		case err == nil, errors.Is(err, payment.ErrNotLeader):
			loop.Succeed()          // the database answered: a healthy standby
			sleep(ctx, r.opts.Poll) // looks again every Poll
		default:
			loop.Fail(ctx, err)
		}
	}
}

var errStopped = errors.New("relay stopped before marking a published batch")

// lead holds the lease and publishes until an error or ctx ends, calling ok
// after every round that succeeded.
func (r *Relay) lead(ctx context.Context, ok func()) error {
	lease, err := r.store.ClaimOutbox(ctx)
	if err != nil {
		return err
	}
	defer lease.Close()
	r.Stats.Leader.Store(true)
	defer r.Stats.Leader.Store(false)
	r.log.Info("relay is the leader")

	if err := r.ensureStream(ctx); err != nil {
		return err
	}
	// A pass of pruning starts at most once a minute, and takes one batch
	// per round, between publishing ones: a long pass never holds events
	// back for more than a batch.
	var nextPass time.Time
	pruning := false
	for ctx.Err() == nil {
		n, err := r.relayBatch(ctx, lease)
		if err != nil {
			return err
		}
		ok()
		if pruning || !time.Now().Before(nextPass) {
			if pruning, err = r.prune(ctx, lease); err != nil {
				return err
			}
			if !pruning {
				nextPass = time.Now().Add(time.Minute)
			}
		}
		if n == r.opts.Batch || pruning {
			continue // more are waiting
		}
		if err := lease.Wait(ctx, r.opts.Poll); err != nil {
			return err
		}
	}
	return nil
}

// ensureStream creates the stream if it does not exist, keeping it if it does.
func (r *Relay) ensureStream(ctx context.Context) error {
	_, err := r.js.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = r.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:       Stream,
			Subjects:   []string{SubjectPrefix + ">"},
			Storage:    jetstream.FileStorage,
			Duplicates: 2 * time.Minute,
		})
	}
	if err != nil {
		r.failed(ctx, FailStream)
		return fmt.Errorf("stream %s: %w", Stream, err)
	}
	return nil
}

// ackTimeout bounds the wait for a batch's acknowledgements.
const ackTimeout = 10 * time.Second

// relayBatch publishes one batch in order and marks what the broker stored.
// The batch is pipelined (every message is sent before the first
// acknowledgement is awaited), and each message after the first names its
// predecessor as the stream's expected last message id: if one is lost (a
// connection drops mid-batch), every later one is refused instead of
// overtaking it. JetStream checks duplicates before that expectation, so a
// republished prefix is acknowledged as duplicate and the chain resumes. Only
// the unbroken prefix of acknowledged events is marked; the rest is published
// again next round.
func (r *Relay) relayBatch(ctx context.Context, lease payment.OutboxLease) (int, error) {
	events, err := lease.Unpublished(ctx, r.opts.Batch)
	if err != nil || len(events) == 0 {
		return 0, err
	}
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	var sendErr error
	prev := ""
	for _, e := range events {
		msg, err := Message(e)
		if err != nil {
			return 0, err
		}
		id := msg.Header.Get(jetstream.MsgIDHeader)
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(id)}
		if prev != "" {
			opts = append(opts, jetstream.WithExpectLastMsgID(prev))
		}
		f, err := r.js.PublishMsgAsync(msg, opts...)
		if err != nil {
			sendErr = fmt.Errorf("publish %s: %w", e.Type, err)
			break
		}
		futures = append(futures, f)
		prev = id
	}

	acked, ackErr := r.awaitAcks(ctx, futures, events)
	if acked > 0 {
		r.opts.Observer.Batch(acked)
	}
	if sendErr != nil && ackErr == nil { // awaitAcks told of its own failure
		r.failed(ctx, FailSend)
	}
	if r.beforeMark != nil && acked > 0 {
		if err := r.beforeMark(); err != nil {
			return 0, errors.Join(errStopped, err)
		}
	}
	if acked > 0 {
		if err := lease.MarkPublished(ctx, events[:acked]); err != nil {
			return 0, err
		}
	}
	if err := errors.Join(ackErr, sendErr); err != nil {
		return 0, err
	}
	return acked, nil
}

// awaitAcks waits for the acknowledgements in order and returns how many of
// the first ones succeeded, and the first failure. futures[i] publishes
// events[i].
func (r *Relay) awaitAcks(ctx context.Context, futures []jetstream.PubAckFuture, events []payment.OutboxEvent) (int, error) {
	timeout := time.NewTimer(ackTimeout)
	defer timeout.Stop()
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				r.Stats.Duplicates.Add(1)
			} else {
				r.Stats.Published.Add(1)
				r.opts.Observer.Published(sinceCommit(events[i].CreatedAt))
			}
		case err := <-f.Err():
			r.failed(ctx, FailRefused)
			return i, fmt.Errorf("publish %s: %w", f.Msg().Subject, err)
		case <-timeout.C:
			r.failed(ctx, FailTimeout)
			return i, fmt.Errorf("no acknowledgement from NATS within %s", ackTimeout)
		case <-ctx.Done():
			return i, ctx.Err()
		}
	}
	return len(futures), nil
}

// failed tells the observer of a failed round, unless ctx has ended: a relay
// stopping is no failure.
func (r *Relay) failed(ctx context.Context, reason string) {
	if ctx.Err() == nil {
		r.opts.Observer.Failed(reason)
	}
}

// prune runs a batch of the pass of pruning and reports whether the pass
// goes on.
func (r *Relay) prune(ctx context.Context, lease payment.OutboxLease) (more bool, err error) {
	n, more, err := lease.Prune(ctx, r.opts.Retention, r.opts.PruneBatch)
	r.Stats.Pruned.Add(n)
	return more, err
}

// Message renders an event as the message the relay publishes: subject
// payments.<type>, the event's public JSON as the body, its id as Nats-Msg-Id
// and its merchant in the Payments-Merchant-Id header.
func Message(e payment.OutboxEvent) (*nats.Msg, error) {
	body, err := e.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	msg := nats.NewMsg(SubjectPrefix + e.Type)
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, payment.FormatID(payment.PrefixEvent, e.ID))
	msg.Header.Set(MerchantHeader, e.MerchantID.String())
	return msg, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
