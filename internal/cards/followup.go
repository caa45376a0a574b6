package cards

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
)

// Captures, voids and refunds of a card charge go to the processor through
// the same three phases as its authorization, each as an operation of its
// own: its id is our reference for it (a refund's is the refund's), its
// processor key is derived from that id and its kind, and it names the psp
// reference of the charge's authorization.
//
//  1. One keyed write: the charge locked and the request decided against it
//     (refusals are stored under the key like an account charge's), then
//     the operation in processing (and a refund's row, pending: its amount
//     is reserved), the key bound to it.
//  2. The call, holding nothing, on a context of its own.
//  3. A compare-and-set from processing (carddb.FollowUps.Settle): approved,
//     the charge captured or voided, or the refund succeeded, with its
//     event and the key's response; declined, the charge unchanged, the
//     refund failed, the key's response the processor's refusal; unknown,
//     the operation stays open for recovery.
//
// While one is in flight the charge keeps its status. Recovery
// (checkFollowUp) looks at the payment (a capture's captured amount, a
// void's status), else sends the operation again with its processor key,
// which the processor answers once; an outcome unknown past
// Options.ReviewAfter goes to review. Nothing is reversed: the merchant
// asked for it.

// prefixOperation formats the id of a capture or a void, which is no
// object of the API.
const prefixOperation = "op_"

// Capture captures amount (nil: all that was authorized) of the card charge
// under req's key, at most once whatever the retries, and returns the key's
// final response, or, when the outcome is not known within the wait, the
// charge as it stands (res.Operation set; nothing is stored). Errors are
// Charge's.
func (c *Cards) Capture(ctx context.Context, req idempotency.Request, chargeID uuid.UUID, amount *int64) (idempotency.Result, *payment.Charge, error) {
	return c.followUp(ctx, req, carddb.KindCapture, chargeID, amount)
}

// Void cancels the card charge's authorization under req's key, as Capture
// does.
func (c *Cards) Void(ctx context.Context, req idempotency.Request, chargeID uuid.UUID) (idempotency.Result, *payment.Charge, error) {
	return c.followUp(ctx, req, carddb.KindVoid, chargeID, nil)
}

// Refund refunds amount (nil: all that is left) of the card charge under
// req's key, as Capture does; not known within the wait, it returns the
// refund as it stands (pending).
func (c *Cards) Refund(ctx context.Context, req idempotency.Request, chargeID uuid.UUID, amount *int64) (idempotency.Result, *payment.Refund, error) {
	res, processing, err := c.followUp(ctx, req, carddb.KindRefund, chargeID, amount)
	if err != nil || processing == nil {
		return res, nil, err
	}
	rf, err := c.store.Refund(ctx, req.MerchantID, res.Operation)
	if err != nil {
		return idempotency.Result{}, nil, err
	}
	return res, &rf, nil
}

func (c *Cards) followUp(ctx context.Context, req idempotency.Request, kind string, chargeID uuid.UUID, amount *int64) (idempotency.Result, *payment.Charge, error) {
	if c.opts.Processor == nil {
		return idempotency.Result{}, nil, payment.ErrNoProcessor
	}
	var started carddb.Operation
	res, err := c.keys.Idempotent(ctx, req, func(ctx context.Context, tx carddb.Tx) (idempotency.Answer, error) {
		ans, op, err := c.startFollowUp(ctx, tx, req.MerchantID, kind, chargeID, amount)
		started = op
		return ans, err
	})
	if err != nil || res.Operation == uuid.Nil {
		return res, nil, err
	}
	if res.Replayed {
		return c.await(ctx, req.MerchantID, res.Operation, c.opts.KeyWait, nil, true)
	}
	return c.await(ctx, req.MerchantID, res.Operation, c.opts.Wait, c.callFollowUp(started), false)
}

// startFollowUp is phase 1's work under the key: the charge locked, the
// request decided against it, and the operation started, or the refusal
// answered.
func (c *Cards) startFollowUp(ctx context.Context, tx carddb.Tx, merchant uuid.UUID, kind string, chargeID uuid.UUID, amount *int64) (idempotency.Answer, carddb.Operation, error) {
	l, err := tx.LockCardCharge(ctx, merchant, chargeID)
	if errors.Is(err, payment.ErrNotFound) {
		return c.refuse(kind, payment.Charge{ID: chargeID}, err)
	}
	if err != nil {
		return idempotency.Answer{}, carddb.Operation{}, err
	}
	if !c.ours(l.Processor) {
		// Not a refusal to store: the charge is as it was, and the request
		// succeeds once this service calls the charge's processor again.
		return idempotency.Answer{}, carddb.Operation{}, fmt.Errorf("%w: charge %s was authorized at %q",
			payment.ErrProcessorNotConfigured, payment.FormatID(payment.PrefixCharge, chargeID), l.Processor)
	}
	n, err := admit(kind, l, amount)
	if err != nil {
		return c.refuse(kind, l.Charge, err)
	}
	ch := l.Charge
	id := payment.NewID()
	op := carddb.Operation{Merchant: merchant, ID: id, ChargeID: ch.ID, Kind: kind, State: carddb.Processing,
		Processor: c.opts.Processor.Name(), ProcessorKey: followUpKey(id, kind), Amount: n, Currency: ch.Currency, PaymentMethod: ch.PaymentMethod,
		PSPReference: l.PSPReference, Charge: ch}
	f := carddb.FollowUp{Op: op, ReviewAfter: c.opts.ReviewAfter, CheckAfter: c.lease()}
	if kind == carddb.KindRefund {
		f.Refund = &payment.Refund{ID: id, ChargeID: ch.ID, Amount: n, Currency: ch.Currency, Status: payment.RefundPending}
	}
	at, err := tx.InsertFollowUp(ctx, f)
	op.CreatedAt, op.Now, op.DecisionDeadline = at, at, at.Add(c.opts.ReviewAfter)
	return idempotency.Answer{Operation: id}, op, err
}

// refuse answers a request refused before the processor was called: its
// response is stored under the key.
func (c *Cards) refuse(kind string, ch payment.Charge, refusal error) (idempotency.Answer, carddb.Operation, error) {
	resp, err := c.opts.RenderOperation(payment.CardOperation{Kind: kind, Charge: ch, Err: refusal})
	if err != nil {
		return idempotency.Answer{}, carddb.Operation{}, err
	}
	return idempotency.Answer{Response: resp}, carddb.Operation{}, nil
}

// admit decides a capture, void or refund of the locked charge as an
// account charge's is decided, and returns the operation's amount, or the
// refusal: the charge still processing, not authorized (not succeeded, for
// a refund), more than was authorized or is left, or a capture or void of
// it already in flight.
func admit(kind string, l carddb.LockedCharge, amount *int64) (int64, error) {
	ch := l.Charge
	if ch.Status == payment.ChargeProcessing {
		op := map[string]error{carddb.KindCapture: payment.ErrChargeNotCapturable, carddb.KindVoid: payment.ErrChargeNotVoidable,
			carddb.KindRefund: payment.ErrChargeNotRefundable}[kind]
		return 0, &payment.ChargeStateError{Op: op, Charge: ch}
	}
	switch kind {
	case carddb.KindCapture:
		after, err := payment.CaptureCharge(ch, amount, l.Now)
		if err != nil {
			return 0, err
		}
		return after.AmountCaptured, settling(l)
	case carddb.KindVoid:
		if _, err := payment.VoidCharge(ch, l.Now); err != nil {
			return 0, err
		}
		return ch.Amount, settling(l) // a void names the authorized amount
	}
	if ch.Status != payment.ChargeSucceeded {
		return 0, &payment.ChargeStateError{Op: payment.ErrChargeNotRefundable, Charge: ch}
	}
	left := ch.AmountCaptured - ch.AmountRefunded - l.Refunding
	n := left
	if amount != nil {
		n = *amount
	}
	if n <= 0 || n > left {
		return 0, fmt.Errorf("%w: %d %s asked, %d left of %d captured (%d refunded, %d being refunded)",
			payment.ErrRefundExceedsCharge, n, ch.Currency, max(left, 0), ch.AmountCaptured, ch.AmountRefunded, l.Refunding)
	}
	return n, nil
}

// settling refuses a capture or void of a charge that has one in flight.
func settling(l carddb.LockedCharge) error {
	if l.Settling != "" {
		return &payment.OperationInProgress{Charge: l.Charge, Kind: l.Settling}
	}
	return nil
}

// followUpKey is the processor's idempotency key of a capture, void or
// refund: derived from its id and kind, the same on every attempt.
func followUpKey(id uuid.UUID, kind string) string {
	prefix := prefixOperation
	if kind == carddb.KindRefund {
		prefix = payment.PrefixRefund
	}
	return payment.FormatID(prefix, id) + ":" + kind
}

// callFollowUp is phase 2 and 3 of an operation this request started
// (goCall).
func (c *Cards) callFollowUp(op carddb.Operation) <-chan answered {
	return c.goCall(op, func(ctx context.Context) processor.Result { return c.send(ctx, op) },
		func(ctx context.Context, fetched time.Time, o outcome) (answered, error) {
			return c.applyFollowUpAnswered(ctx, op, fetched, o)
		})
}

// send asks the processor for op, with its processor key: the same request
// on every attempt.
func (c *Cards) send(ctx context.Context, op carddb.Operation) processor.Result {
	switch op.Kind {
	case carddb.KindCapture:
		return c.opts.Processor.Capture(ctx, op.ProcessorKey, op.PSPReference, op.Amount)
	case carddb.KindVoid:
		return c.opts.Processor.Void(ctx, op.ProcessorKey, op.PSPReference)
	}
	return c.opts.Processor.Refund(ctx, op.ProcessorKey, op.PSPReference, op.Amount)
}

// applyFollowUp writes the change o brings to op, a compare-and-set: when op
// changed meanwhile, it reads op again and decides afresh.
func (c *Cards) applyFollowUp(ctx context.Context, op carddb.Operation, fetched time.Time, o outcome) error {
	_, err := c.applyFollowUpAnswered(ctx, op, fetched, o)
	return err
}

// applyFollowUpAnswered is applyFollowUp, and returns the key's response if
// the change it wrote stored one.
func (c *Cards) applyFollowUpAnswered(ctx context.Context, op carddb.Operation, fetched time.Time, o outcome) (answered, error) {
	for range 3 {
		st, ok, err := c.decideFollowUp(op, o, op.Now.Add(time.Since(fetched)))
		if err != nil || !ok {
			return answered{}, err
		}
		w, err := c.store.Settle(ctx, st)
		switch {
		case err != nil:
			return answered{}, err
		case w.Applied:
			c.observeFollowUp(op, fetched, st)
			return answeredBy(w, st.Answer), nil
		}
		if op, err = c.store.Operation(ctx, op.Merchant, op.ID); err != nil {
			return answered{}, err
		}
		fetched = time.Now()
	}
	return answered{}, errLost
}

// decideFollowUp returns the change o brings to op at now, and false when
// it changes nothing (op is no longer processing).
func (c *Cards) decideFollowUp(op carddb.Operation, o outcome, now time.Time) (carddb.Settlement, bool, error) {
	st := carddb.Settlement{Merchant: op.Merchant, Operation: op.ID, From: op.State, To: op.State,
		Attempts: op.Attempts, LastCode: op.LastCode}
	if op.State != carddb.Processing {
		return st, false, nil
	}
	done := payment.CardOperation{Kind: op.Kind, Charge: op.Charge}
	var event any
	switch o.kind {
	case approved:
		st.To = carddb.Succeeded
		ch := &done.Charge
		switch op.Kind {
		case carddb.KindCapture:
			ch.Status, ch.AmountCaptured = payment.ChargeSucceeded, op.Amount
			st.Charge, st.Event.Type, event = ch, payment.EventChargeCaptured, ch
		case carddb.KindVoid:
			ch.Status = payment.ChargeVoided
			st.Charge, st.Event.Type, event = ch, payment.EventChargeVoided, ch
		default:
			rf := payment.Refund{ID: op.ID, ChargeID: op.ChargeID, Amount: op.Amount, Currency: op.Currency,
				Status: payment.RefundSucceeded, CreatedAt: op.CreatedAt}
			ch.AmountRefunded += op.Amount
			done.Refund = &rf
			st.Refunded, st.RefundStatus, st.Event.Type, event = op.Amount, payment.RefundSucceeded, payment.EventRefundCreated, rf
		}
	case declined:
		st.To, st.LastCode = carddb.Failed, o.code
		if op.Kind == carddb.KindRefund {
			st.RefundStatus = payment.RefundFailed
		}
		done.Err = &payment.OperationDeclined{Kind: op.Kind, Charge: op.Charge, Code: o.code}
	case unknown:
		st.Attempts, st.LastCode, st.CheckAfter = op.Attempts+1, o.code, c.backoff(op.Attempts+1, o.after)
		if now.After(op.DecisionDeadline) {
			// Sent again past the processor's key retention, it could be
			// done twice: an operator decides (the key stays bound).
			st.To = carddb.RequiresReview
		}
		return st, true, nil
	default:
		return st, false, nil
	}
	if event != nil {
		payload, err := json.Marshal(event)
		if err != nil {
			return st, false, fmt.Errorf("encode %s: %w", st.Event.Type, err)
		}
		st.Event.ID, st.Event.Payload = payment.NewID(), payload
		st.EventAggregate, st.EventAggregateID = "charge", op.ChargeID
		if op.Kind == carddb.KindRefund {
			st.EventAggregate, st.EventAggregateID = "refund", op.ID
		}
	}
	resp, err := c.opts.RenderOperation(done)
	if err != nil {
		return st, false, fmt.Errorf("render %s: %w", op.Kind, err)
	}
	st.Answer = &resp
	return st, true, nil
}

// observeFollowUp counts a change written.
func (c *Cards) observeFollowUp(op carddb.Operation, fetched time.Time, st carddb.Settlement) {
	if st.To == st.From {
		return
	}
	if st.To == carddb.RequiresReview {
		c.Stats.Reviews.Add(1)
	}
	c.opts.Log.Info("card operation", "charge_id", payment.FormatID(payment.PrefixCharge, op.ChargeID), "operation", op.Kind,
		"from", string(st.From), "to", string(st.To), "code", st.LastCode)
	if c.opts.OnResolved != nil {
		now := op.Now.Add(time.Since(fetched))
		c.opts.OnResolved(string(st.To), now.Sub(op.CreatedAt))
	}
}

// checkFollowUp resolves a claimed capture, void or refund: approved when
// the payment shows it done, else sent again with its processor key (the
// processor answers a request it has done from its first answer).
func (c *Cards) checkFollowUp(ctx context.Context, op carddb.Operation, fetched time.Time) error {
	if c.evident(ctx, op) {
		return c.applyFollowUp(ctx, op, fetched, outcome{kind: approved})
	}
	c.Stats.Redrives.Add(1)
	cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	res := c.counted(c.send(cctx, op))
	cancel()
	return c.applyFollowUp(ctx, op, fetched, outcomeOf(res))
}

// evident reports whether the charge's payment at the processor shows op
// done: a capture's captured amount, a void's status. A refund is not told
// apart from the charge's other refunds by the payment's refunded amount:
// its re-drive, answered from the processor's idempotency once done, is its
// lookup.
func (c *Cards) evident(ctx context.Context, op carddb.Operation) bool {
	if op.Kind == carddb.KindRefund {
		return false
	}
	c.Stats.Lookups.Add(1)
	cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	found, err := c.opts.Processor.Lookup(cctx, payment.FormatID(payment.PrefixCharge, op.ChargeID))
	cancel()
	if err != nil {
		return false
	}
	for _, p := range found {
		switch {
		case p.PSPReference != op.PSPReference:
		case op.Kind == carddb.KindCapture:
			return p.CapturedAmount == op.Amount
		case op.Kind == carddb.KindVoid:
			return p.Status == "voided"
		}
	}
	return false
}
