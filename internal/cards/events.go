package cards

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
)

// Processor events: the processor announces an outcome it decided later (an
// asynchronous approval) with a signed webhook, delivered at least once and
// in any order. Each is verified, then taken as a reason to look, not as the
// outcome: the service asks the processor's API by our reference (a lookup,
// which the processor knows it answered) and applies what that says, by the
// same compare-and-set as every other outcome, recorded by the processor's
// event id in the same transaction. A duplicate delivery changes nothing, a
// webhook racing a lookup applies once, and a charge is never shown
// succeeded on the word of a webhook alone: a processor may cancel an
// approval whose answer it never gave (the simulator does at its decision
// deadline, as Adyen does), and a webhook is not such an answer.

// signatureTolerance is how far from now a webhook's signature may be made.
const signatureTolerance = 5 * time.Minute

// HandleEvent verifies the processor's webhook (body and its signature
// header) and applies what a lookup by our reference then says. An event about a reference
// that is not ours is ignored. Errors: payment.ErrNoProcessor,
// processor.ErrBadEvent, payment.ErrUnavailable (the processor should deliver it
// again). A webhook that does not verify is processor.ErrBadEvent.
func (c *Cards) HandleEvent(ctx context.Context, signature string, body []byte) error {
	if c.opts.Processor == nil {
		return payment.ErrNoProcessor
	}
	ev, err := c.opts.Webhooks.ParseEvent(signature, body, signatureTolerance, time.Now())
	if err != nil {
		return err
	}
	id, ok := payment.ParseID(payment.PrefixCharge, ev.Payment.Reference)
	if !ok {
		c.opts.Log.Info("processor event about a reference not ours", "event", ev.ID, "reference", ev.Payment.Reference)
		return nil
	}
	op, err := c.store.OperationByReference(ctx, id)
	switch {
	case errors.Is(err, payment.ErrNotFound):
		c.opts.Log.Info("processor event about a reference not ours", "event", ev.ID, "reference", ev.Payment.Reference)
		return nil
	case err != nil:
		return err
	case !c.ours(op.Processor):
		c.opts.Log.Warn("processor event about an operation sent to another processor", "event", ev.ID,
			"reference", ev.Payment.Reference, "operation_processor", op.Processor)
		return nil
	}
	hint, known := outcomeOfPayments([]processor.Payment{ev.Payment})
	if !known {
		return nil
	}
	fetched := time.Now()
	if _, changes := c.decide(op, hint); !changes {
		// Nothing the event says could change the charge (it is final, or
		// being reversed): it is recorded, with no call to the processor.
		return ignoreDuplicate(c.apply(ctx, op, fetched, hint, carddb.Inbound{ID: ev.ID, Type: ev.Type}))
	}
	o, err := c.lookup(ctx, op, fetched)
	switch {
	case err != nil:
		return err
	case o.kind == unknown && o.code == codeLookupFailed:
		// Not confirmed: the processor delivers the event again, and
		// recovery looks meanwhile.
		return fmt.Errorf("%w: the processor's event could not be confirmed by a lookup", payment.ErrUnavailable)
	}
	return ignoreDuplicate(c.apply(ctx, op, fetched, o, carddb.Inbound{ID: ev.ID, Type: ev.Type}))
}

// ignoreDuplicate is err, but nil for an event recorded before: applied
// already, it is acknowledged again.
func ignoreDuplicate(err error) error {
	if errors.Is(err, carddb.ErrDuplicateEvent) {
		return nil
	}
	return err
}
