package cards

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/retry"
)

// The state machine of an operation (docs/processors.md draws it). Every
// change of state writes one event; a check that finds nothing new only
// moves the next check.
//
//	processing --approved--> succeeded (charge succeeded, or authorized)
//	processing --declined, cancelled, no record--> failed
//	processing --unknown for too long--> reversing
//	reversing --reversal accepted--> reversed
//	reversing --reversal refused ReversalAttempts times--> requires_review
//	requires_review --an operator's settlement (resolve.go)--> succeeded, failed
//	failed, reversed --approved (late)--> reversing

// outcomeKind is what became known about an operation.
type outcomeKind string

const (
	approved        outcomeKind = "approved"         // the processor approved it (Payment)
	declined        outcomeKind = "declined"         // declined, with the processor's code
	cancelled       outcomeKind = "cancelled"        // the processor cancelled it (its status in code)
	noRecord        outcomeKind = "no_record"        // not found past the decision deadline
	unknown         outcomeKind = "unknown"          // nothing known yet (code says why); check again
	giveUp          outcomeKind = "give_up"          // unknown past the decision deadline: reverse
	reversalOK      outcomeKind = "reversal_ok"      // the processor accepted the reversal
	reversalRefused outcomeKind = "reversal_refused" // it did not (code says how)
	// An operator's settlement of a charge in review, from the processor's
	// records: it kept the money, or it did not.
	resolvedSucceeded outcomeKind = "resolved_succeeded"
	resolvedFailed    outcomeKind = "resolved_failed"
)

// outcome is what became known, and when to check again if nothing final.
type outcome struct {
	kind    outcomeKind
	code    string
	payment processor.Payment
	// after, when set, is when to check again instead of the backoff.
	after time.Duration
}

// outcomeOf is the outcome of an authorization's answer.
func outcomeOf(r processor.Result) outcome {
	switch r.Outcome {
	case processor.Approved:
		return outcome{kind: approved, payment: r.Payment}
	case processor.Declined:
		return outcome{kind: declined, code: r.Code, payment: r.Payment}
	case processor.Pending:
		return outcome{kind: unknown, code: "pending", payment: r.Payment}
	}
	return outcome{kind: unknown, code: r.Code}
}

// decide returns the transition o brings to op at now, and false when it
// changes nothing (an approval of an operation that already succeeded, or
// is being reversed).
func (c *Cards) decide(op carddb.Operation, o outcome) (carddb.Transition, bool) {
	t := carddb.Transition{Merchant: op.Merchant, Operation: op.ID, From: op.State, To: op.State, Charge: op.Charge,
		PSPReference: o.payment.PSPReference, Attempts: op.Attempts, ReversalAttempts: op.ReversalAttempts,
		ReversalRound: op.ReversalRound, LastCode: op.LastCode}
	ch := &t.Charge
	switch {
	case op.State == carddb.Processing && o.kind == approved,
		op.State == carddb.RequiresReview && o.kind == resolvedSucceeded:
		// The charge's own capture flag says what the approval was.
		t.To, ch.Status, ch.AmountCaptured = carddb.Succeeded, payment.ChargeSucceeded, ch.Amount
		ch.FailureCode, ch.DeclineCode = "", ""
		if !op.Capture {
			ch.Status, ch.AmountCaptured = payment.ChargeAuthorized, 0
		}
	case op.State == carddb.Processing && (o.kind == declined || o.kind == cancelled || o.kind == noRecord),
		op.State == carddb.RequiresReview && o.kind == resolvedFailed:
		t.To, ch.Status, ch.FailureCode, ch.DeclineCode = carddb.Failed, payment.ChargeFailed, failureCode(o.kind), o.code
		ch.AmountCaptured = 0
	case op.State == carddb.Processing && o.kind == unknown:
		t.Attempts, t.LastCode, t.CheckAfter = op.Attempts+1, o.code, c.backoff(op.Attempts+1, o.after)
	case op.State == carddb.Processing && o.kind == giveUp,
		(op.State == carddb.Failed || op.State == carddb.Reversed) && o.kind == approved:
		// An approval after the charge failed or was reversed is never kept
		// silently: it is reversed (again), under a reversal key of its own.
		t.To, ch.Status, ch.FailureCode, ch.AmountCaptured = carddb.Reversing, payment.ChargeReversing, "", 0
		t.ReversalRound, t.ReversalAttempts, t.LastCode = op.ReversalRound+1, 0, o.code
	case op.State == carddb.Reversing && o.kind == reversalOK:
		t.To, ch.Status = carddb.Reversed, payment.ChargeReversed
	case op.State == carddb.Reversing && o.kind == reversalRefused:
		t.ReversalAttempts, t.LastCode = op.ReversalAttempts+1, o.code
		t.CheckAfter = c.backoff(t.ReversalAttempts, 0)
		if t.ReversalAttempts >= c.opts.ReversalAttempts {
			t.To, ch.Status = carddb.RequiresReview, payment.ChargeRequiresReview
		}
	default:
		return carddb.Transition{}, false
	}
	return t, true
}

// failureCode is the failure code of a charge that failed by o.
func failureCode(o outcomeKind) string {
	switch o {
	case declined:
		return payment.FailureCardDeclined
	case cancelled:
		return payment.FailureProcessorCancelled
	case resolvedFailed:
		return payment.FailureOperatorResolved
	}
	return payment.FailureProcessorNoRecord
}

// backoff is the wait before an operation's attempt-th next check: from
// Backoff, doubling, up to MaxBackoff; or after, when it is set.
func (c *Cards) backoff(attempt int, after time.Duration) time.Duration {
	if after > 0 {
		return after
	}
	return retry.Policy{First: c.opts.Backoff, Max: c.opts.MaxBackoff}.Ceiling(attempt)
}

// events are the event of each state entered, by the charge's new status.
var events = map[payment.ChargeStatus]string{
	payment.ChargeSucceeded:      payment.EventChargeSucceeded,
	payment.ChargeAuthorized:     payment.EventChargeAuthorized,
	payment.ChargeFailed:         payment.EventChargeFailed,
	payment.ChargeReversing:      payment.EventChargeReversing,
	payment.ChargeReversed:       payment.EventChargeReversed,
	payment.ChargeRequiresReview: payment.EventChargeRequiresReview,
}

// apply writes the transition o brings to op, a compare-and-set: when op
// changed meanwhile (another replica, a webhook, a late answer), it reads
// op again and decides afresh. fetched is when op was read, by the local
// clock.
func (c *Cards) apply(ctx context.Context, op carddb.Operation, fetched time.Time, o outcome, in carddb.Inbound) error {
	_, err := c.applyAnswered(ctx, op, fetched, o, in)
	return err
}

// applyAnswered is apply, and returns the key's response if the transition
// it wrote stored one.
func (c *Cards) applyAnswered(ctx context.Context, op carddb.Operation, fetched time.Time, o outcome, in carddb.Inbound) (answered, error) {
	for range 3 {
		t, ok := c.decide(op, o)
		if !ok {
			if in.ID != "" {
				_, err := c.store.RecordEvent(ctx, op.Merchant, op.ID, in)
				return answered{}, err
			}
			return answered{}, nil
		}
		t.Inbound = in
		if err := c.complete(&t); err != nil {
			return answered{}, err
		}
		w, err := c.store.Transition(ctx, t)
		switch {
		case err != nil:
			return answered{}, err
		case w.Applied:
			c.observe(op, fetched, t)
			return answeredBy(w, t.Answer), nil
		}
		if op, err = c.store.Operation(ctx, op.Merchant, op.ID); err != nil {
			return answered{}, err
		}
		fetched = time.Now()
	}
	return answered{}, errLost
}

// complete adds to a change of state its event and, for a final charge, the
// key's response.
func (c *Cards) complete(t *carddb.Transition) error {
	if t.To == t.From {
		return nil
	}
	payload, err := json.Marshal(t.Charge)
	if err != nil {
		return fmt.Errorf("encode charge: %w", err)
	}
	t.Event = carddb.Event{ID: payment.NewID(), Type: events[t.Charge.Status], Payload: payload}
	switch t.To {
	case carddb.Succeeded, carddb.Failed, carddb.Reversed:
		resp, err := c.opts.Render(t.Charge)
		if err != nil {
			return fmt.Errorf("render charge: %w", err)
		}
		t.Answer = &resp
	}
	return nil
}

// observe counts a transition written.
func (c *Cards) observe(op carddb.Operation, fetched time.Time, t carddb.Transition) {
	if t.To == t.From {
		return
	}
	if t.To == carddb.RequiresReview {
		c.Stats.Reviews.Add(1)
	}
	c.opts.Log.Info("card charge", "charge_id", reference(op), "from", string(t.From), "to", string(t.To),
		"status", string(t.Charge.Status), "code", t.LastCode)
	switch t.To {
	case carddb.Succeeded, carddb.Failed, carddb.Reversed, carddb.RequiresReview:
		if c.opts.OnResolved != nil {
			now := op.Now.Add(time.Since(fetched))
			c.opts.OnResolved(string(t.To), now.Sub(op.CreatedAt))
		}
	}
}
