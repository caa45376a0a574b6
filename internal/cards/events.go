package cards

import (
	"context"
	"errors"
	"time"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
)

// Processor events: the processor announces an outcome it decided later (an
// asynchronous approval) with a signed webhook, delivered at least once and
// in any order. Each is verified, then applied by the same compare-and-set
// as every other outcome, recorded by the processor's event id in the same
// transaction: a duplicate delivery changes nothing, and a webhook racing a
// lookup applies once.

// signatureTolerance is how far from now a webhook's signature may be made.
const signatureTolerance = 5 * time.Minute

// HandleEvent verifies the processor's webhook (body and its signature
// header) and applies the outcome it announces. An event about a reference
// that is not ours is ignored. Errors: payment.ErrProcessorNotConfigured,
// processor.ErrBadEvent, payment.ErrUnavailable (the processor should deliver it
// again). A webhook that does not verify is processor.ErrBadEvent.
func (c *Cards) HandleEvent(ctx context.Context, signature string, body []byte) error {
	if c.opts.Processor == nil {
		return payment.ErrProcessorNotConfigured
	}
	ev, err := processor.ParseSimulatorEvent(c.opts.WebhookSecret, signature, body, signatureTolerance, time.Now())
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
	}
	o, known := outcomeOfPayments([]processor.Payment{ev.Payment})
	if !known {
		return nil
	}
	err = c.apply(ctx, op, time.Now(), o, carddb.Inbound{ID: ev.ID, Type: ev.Type})
	if errors.Is(err, carddb.ErrDuplicateEvent) {
		return nil
	}
	return err
}
