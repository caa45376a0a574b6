// Package cards is the use case of a charge at a card processor, exactly
// once when the processor's answer is lost. Its database is a port it
// declares (carddb.Store), which internal/postgres implements; the
// processor is internal/processor's port. A charge goes in three phases:
//
//  1. One keyed write (idempotency.Keys over carddb.Store): the charge in
//     processing, its operation at the processor (our reference, the
//     processor key derived from it, a decision deadline and a lease), the
//     charge.processing event, and the key bound to the operation,
//     committed and confirmed by the standby before any byte goes out.
//  2. The call to the processor, holding no connection and no lock, on a
//     context of its own (the client may leave; the charge goes on).
//  3. One transaction (carddb.Store.Transition), a compare-and-set from
//     processing: the outcome, its event and the key's final response.
//
// The request waits up to Options.Wait for the outcome, else answers the
// charge as it stands (processing). A retry under the same key never calls
// the processor: it waits up to Options.KeyWait for the outcome. Recovery
// (recovery.go), on every replica, resolves every operation whose outcome
// stayed unknown; a processor's webhook (events.go) applies its outcome by
// the same compare-and-set. decide.go is the state machine;
// docs/processors.md draws it.
package cards

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
)

// Options tune Cards. Zero durations take the defaults.
type Options struct {
	// Processor is the card processor; nil refuses every card charge with
	// payment.ErrNoProcessor, writing nothing.
	Processor processor.Processor
	// Render renders a charge's final state as the response stored under
	// its key (201, 402, ...): the caller knows status codes, this package
	// does not. An error stores nothing; the operation stays open.
	Render func(payment.Charge) (idempotency.Response, error)
	// RenderOperation renders how a capture, void or refund ended (done,
	// refused before the call, or declined by the processor) as the
	// response stored under its key (200, 201, 409, ...). An error stores
	// nothing.
	RenderOperation func(payment.CardOperation) (idempotency.Response, error)
	// Webhooks verifies and decodes the processor's webhooks (events.go);
	// nil: the simulator's, signed with WebhookSecret.
	Webhooks      processor.Webhooks
	WebhookSecret string
	// Wait (PROCESSOR_WAIT, default 5s) is how long a charge's request
	// waits for its outcome; KeyWait (IDEMPOTENCY_WAIT, default 5s) how
	// long a retry under its key does.
	Wait, KeyWait time.Duration
	// CallTimeout (PROCESSOR_TIMEOUT, default 30s) bounds each call to the
	// processor. DecisionDeadline (PROCESSOR_DECISION_DEADLINE, default
	// 120s) is the processor's: past it, whatever it received is decided.
	CallTimeout, DecisionDeadline time.Duration
	// ReviewAfter (default 24h) bounds a capture, void or refund whose
	// outcome stays unknown: recovery sends it again with its processor
	// key until then, and past it the operation goes to review. It must
	// not exceed how long the processor keeps its idempotency keys
	// (Stripe's 24 hours): a re-drive past that could do it twice.
	ReviewAfter time.Duration
	// Interval (RECOVERY_INTERVAL, default 1s) is how often recovery looks
	// for due operations. Backoff (default 1s) is the wait before an
	// operation's next check, doubled after each, up to MaxBackoff (30s).
	Interval, Backoff, MaxBackoff time.Duration
	// Poll (default 100ms) is how often a waiting request reads its
	// operation.
	Poll time.Duration
	// ReversalAttempts (default 5) is how many failed reversals send a
	// charge to review.
	ReversalAttempts int
	// KeyTTL is how long keys are kept (IDEMPOTENCY_TTL).
	KeyTTL time.Duration
	// OnResolved, if set, is told each operation's final state and how
	// long it took from its creation.
	OnResolved func(state string, took time.Duration)
	Log        *slog.Logger
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Wait, 5*time.Second)
	def(&o.KeyWait, 5*time.Second)
	def(&o.CallTimeout, 30*time.Second)
	def(&o.DecisionDeadline, 120*time.Second)
	def(&o.ReviewAfter, 24*time.Hour)
	def(&o.Interval, time.Second)
	def(&o.Backoff, time.Second)
	def(&o.MaxBackoff, 30*time.Second)
	def(&o.Poll, 100*time.Millisecond)
	if o.ReversalAttempts <= 0 {
		o.ReversalAttempts = 5
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Webhooks == nil {
		o.Webhooks = processor.SimulatorWebhooks{Secret: o.WebhookSecret}
	}
	return o
}

// Stats count what recovery did, for the metrics; Open, InReview and
// OldestOpen are its last reading of the operations (Store.Open).
type Stats struct {
	Lookups, Redrives, Reversals, Reviews atomic.Int64
	// KeyMismatches counts the processor's refusals of one of our
	// processor keys sent again with other parameters (a bug of ours).
	KeyMismatches  atomic.Int64
	Open, InReview atomic.Int64
	OldestOpen     atomic.Int64 // nanoseconds
}

// Cards charges cards at the processor.
type Cards struct {
	store carddb.Store
	keys  *idempotency.Keys[carddb.Tx]
	opts  Options
	calls sync.WaitGroup // phase 2 and 3 of the charges this process started
	Stats Stats
}

// New returns the card charge use case over store.
func New(store carddb.Store, o Options) *Cards {
	o = o.withDefaults()
	return &Cards{store: store, keys: idempotency.NewKeys(store, idempotency.KeysOptions{TTL: o.KeyTTL}), opts: o}
}

// Wait returns once the calls this process started to the processor have
// ended, with their outcome written (or left to recovery).
func (c *Cards) Wait() { c.calls.Wait() }

// Charge charges in under req's key, at most once whatever the retries, and
// returns the key's final response (a replay when it was stored before), or,
// when the outcome is not known within the wait, the charge as it stands
// with the operation it waits for (res.Operation set; nothing is stored).
// Errors: payment.ErrNoProcessor, the key contract's
// (idempotency.ErrKeyReused, ErrKeyInUse), payment.ErrUnavailable, and
// ctx's when the client left (the charge goes on).
func (c *Cards) Charge(ctx context.Context, req idempotency.Request, in payment.NewCardCharge) (res idempotency.Result, processing *payment.Charge, err error) {
	if c.opts.Processor == nil {
		return idempotency.Result{}, nil, payment.ErrNoProcessor
	}
	var started carddb.Operation
	res, err = c.keys.Idempotent(ctx, req, func(ctx context.Context, tx carddb.Tx) (idempotency.Answer, error) {
		op, err := c.start(ctx, tx, req.MerchantID, in)
		started = op
		return idempotency.Answer{Operation: op.ID}, err
	})
	if err != nil || res.Operation == uuid.Nil {
		return res, nil, err
	}
	if res.Replayed {
		return c.await(ctx, req.MerchantID, res.Operation, c.opts.KeyWait, nil, true)
	}
	return c.await(ctx, req.MerchantID, res.Operation, c.opts.Wait, c.call(started), false)
}

// start is phase 1's work under the key: the charge, its operation and
// its event.
func (c *Cards) start(ctx context.Context, tx carddb.Tx, merchant uuid.UUID, in payment.NewCardCharge) (carddb.Operation, error) {
	id := payment.NewID()
	ch := payment.Charge{ID: id, PaymentMethod: in.PaymentMethod, Amount: in.Amount, Currency: in.Currency,
		Status: payment.ChargeProcessing, Description: in.Description, Metadata: in.Metadata}
	if ch.Metadata == nil {
		ch.Metadata = map[string]string{}
	}
	at, err := tx.InsertCharge(ctx, merchant, ch)
	if err != nil {
		return carddb.Operation{}, err
	}
	ch.CreatedAt = at
	payload, err := json.Marshal(ch)
	if err != nil {
		return carddb.Operation{}, fmt.Errorf("encode charge: %w", err)
	}
	op := carddb.Operation{Merchant: merchant, ID: id, ChargeID: id, Kind: carddb.KindAuthorize, State: carddb.Processing,
		Processor: c.opts.Processor.Name(), ProcessorKey: processorKey(id, carddb.KindAuthorize), Amount: in.Amount, Currency: in.Currency,
		PaymentMethod: in.PaymentMethod, Capture: !in.Authorize, DecisionDeadline: at.Add(c.opts.DecisionDeadline),
		CreatedAt: at, Charge: ch, Now: at}
	// The first check is the lease of this request's call: recovery leaves
	// the operation alone while the call may still answer.
	err = tx.InsertOperation(ctx, carddb.Start{Op: op, DecisionAfter: c.opts.DecisionDeadline, CheckAfter: c.lease(),
		Event: carddb.Event{ID: payment.NewID(), Type: payment.EventChargeProcessing, Payload: payload}})
	return op, err
}

// lease is how long a call's operation is left alone: the call's bound and
// a margin for writing its outcome.
func (c *Cards) lease() time.Duration { return c.opts.CallTimeout + 5*time.Second }

// processorKey is the processor's idempotency key of an operation: derived
// from our reference and the kind, the same on every attempt.
func processorKey(id uuid.UUID, kind string) string {
	return payment.FormatID(payment.PrefixCharge, id) + ":" + kind
}

// reference is our reference of an operation, as the processor knows it.
func reference(op carddb.Operation) string { return payment.FormatID(payment.PrefixCharge, op.ID) }

// answered is the key's response as a transition stored it, and when: what
// a call's goroutine hands the request that made the call, which then
// reads nothing back.
type answered struct {
	resp     idempotency.Response
	storedAt time.Time
}

// result is the request's result from a, not replayed.
func (a answered) result() idempotency.Result {
	return idempotency.Result{Response: a.resp, StoredAt: a.storedAt}
}

// stored reports whether a holds a response.
func (a answered) stored() bool { return !a.storedAt.IsZero() }

// answeredBy is what a written transition stored under the key, if any.
func answeredBy(w carddb.Written, resp *idempotency.Response) answered {
	if !w.Applied || w.AnsweredAt.IsZero() || resp == nil {
		return answered{}
	}
	return answered{resp: *resp, storedAt: w.AnsweredAt}
}

// call is phase 2 and 3 of a charge this request started (goCall).
func (c *Cards) call(op carddb.Operation) <-chan answered {
	return c.goCall(op, func(ctx context.Context) processor.Result { return c.opts.Processor.Authorize(ctx, authorization(op)) },
		func(ctx context.Context, fetched time.Time, o outcome) (answered, error) {
			return c.applyAnswered(ctx, op, fetched, o, carddb.Inbound{})
		})
}

// goCall is phase 2 and 3 of an operation this request started, apart from
// the request: send's call to the processor, on a context bounded by
// CallTimeout, then write's outcome, on one of its own. The returned channel
// gets the key's response if the outcome stored one, and is closed when
// done. What could not be written is logged: recovery looks again, the
// operation stays open.
func (c *Cards) goCall(op carddb.Operation, send func(context.Context) processor.Result,
	write func(ctx context.Context, fetched time.Time, o outcome) (answered, error)) <-chan answered {
	done := make(chan answered, 1)
	c.calls.Add(1)
	fetched := time.Now()
	go func() {
		defer c.calls.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.CallTimeout)
		o := outcomeOf(c.counted(send(ctx)))
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, err := write(ctx, fetched, o)
		if err != nil {
			c.opts.Log.Warn("processor outcome not written; recovery will look again",
				"charge_id", payment.FormatID(payment.PrefixCharge, op.ChargeID), "operation", op.Kind, "outcome", o.kind, "error", err)
		}
		if a.stored() {
			done <- a
		}
	}()
	return done
}

// counted is r, counted in Stats when the processor refused our key.
func (c *Cards) counted(r processor.Result) processor.Result {
	if r.Code == processor.CodeKeyMismatch {
		c.Stats.KeyMismatches.Add(1)
	}
	return r
}

func authorization(op carddb.Operation) processor.Authorization {
	return processor.Authorization{Key: op.ProcessorKey, Reference: reference(op), Amount: op.Amount,
		Currency: op.Currency, PaymentMethod: op.PaymentMethod, Capture: op.Capture}
}

// await answers a request bound to operation id: the key's response once
// stored, for up to wait; else the charge as it stands, with the operation
// (nothing stored). The request that made the call (wake set) is handed the
// response its call stored, or reads first when its call has ended without
// one; a retry reads at once; then both every Poll.
func (c *Cards) await(ctx context.Context, merchant, id uuid.UUID, wait time.Duration, wake <-chan answered, replayed bool) (idempotency.Result, *payment.Charge, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	// The request that made the call hears when its outcome is written
	// (wake): it reads nothing before, so that a request waiting for the
	// processor holds no connection and costs the database nothing, and
	// nothing after when the outcome stored the key's response (the
	// transition's commit was confirmed by the standby like any other).
	last := false
	if wake != nil {
		select {
		case <-ctx.Done():
			return idempotency.Result{}, nil, ctx.Err()
		case <-deadline.C:
			last = true
		case a := <-wake:
			if a.stored() {
				return a.result(), nil, nil
			}
		}
	}
	tick := time.NewTicker(c.opts.Poll)
	defer tick.Stop()
	for {
		st, err := c.store.Status(ctx, merchant, id)
		switch {
		case err != nil:
			return idempotency.Result{}, nil, err
		case st.Answered:
			return idempotency.Result{Response: st.Answer, StoredAt: st.StoredAt, Replayed: replayed}, nil, nil
		case last:
			return idempotency.Result{Operation: id, Replayed: replayed}, &st.Charge, nil
		}
		select {
		case <-ctx.Done():
			return idempotency.Result{}, nil, ctx.Err()
		case <-deadline.C:
			last = true
		case <-tick.C:
		}
	}
}

// errLost is an operation that changed under every attempt to write an
// outcome to it.
var errLost = errors.New("cards: the operation kept changing")
