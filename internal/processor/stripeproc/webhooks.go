package stripeproc

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/exactlyonce/payments/internal/processor"
)

// Webhooks verifies Stripe's webhooks (the Stripe-Signature header, checked
// by stripe-go's webhook package) with the endpoint's signing secret
// (STRIPE_WEBHOOK_SECRET). A payment_intent.* event carries the intent; a
// charge.* event (charge.refunded, ...) the charge, whose intent and
// reference it names. Any other event is about no payment.
type Webhooks struct{ Secret string }

var _ processor.Webhooks = Webhooks{}

// SignatureHeader is Stripe's.
func (Webhooks) SignatureHeader() string { return "Stripe-Signature" }

// ParseEvent verifies and decodes a Stripe event. The event's API version
// is not checked against stripe-go's: only the fields read here matter, and
// they are the same in every version this connector knows.
func (w Webhooks) ParseEvent(signature string, body []byte, tolerance time.Duration, _ time.Time) (processor.Event, error) {
	if w.Secret == "" {
		return processor.Event{}, fmt.Errorf("%w: no signing secret is configured", processor.ErrBadEvent)
	}
	ev, err := webhook.ConstructEventWithOptions(body, signature, w.Secret,
		webhook.ConstructEventOptions{Tolerance: tolerance, IgnoreAPIVersionMismatch: true})
	if err != nil {
		return processor.Event{}, fmt.Errorf("%w: %w", processor.ErrBadEvent, err)
	}
	if ev.ID == "" || ev.Data == nil {
		return processor.Event{}, fmt.Errorf("%w: it has no id or no data", processor.ErrBadEvent)
	}
	out := processor.Event{ID: ev.ID, Type: string(ev.Type)}
	switch {
	case strings.HasPrefix(out.Type, "payment_intent."):
		var pi stripe.PaymentIntent
		if err := json.Unmarshal(ev.Data.Raw, &pi); err != nil {
			return processor.Event{}, fmt.Errorf("%w: %w", processor.ErrBadEvent, err)
		}
		out.Payment = paymentOf(&pi)
	case strings.HasPrefix(out.Type, "charge."):
		var ch stripe.Charge
		if err := json.Unmarshal(ev.Data.Raw, &ch); err != nil {
			return processor.Event{}, fmt.Errorf("%w: %w", processor.ErrBadEvent, err)
		}
		out.Payment = paymentOfCharge(&ch)
	}
	return out, nil
}

// paymentOfCharge is what a charge says of its intent: captured or only
// authorized, and what is refunded.
func paymentOfCharge(ch *stripe.Charge) processor.Payment {
	p := processor.Payment{Reference: ch.Metadata[metadataReference], Amount: ch.Amount,
		Currency: strings.ToUpper(string(ch.Currency)), CapturedAmount: ch.AmountCaptured, RefundedAmount: ch.AmountRefunded}
	if ch.PaymentIntent != nil {
		p.PSPReference = ch.PaymentIntent.ID
	}
	switch {
	case ch.Status == stripe.ChargeStatusFailed:
		p.Status, p.DeclineCode = statusDeclined, ch.FailureCode
	case ch.Status == stripe.ChargeStatusPending:
		p.Status = statusPending
	case ch.Captured:
		p.Status, p.ApprovedAmount = statusCaptured, ch.Amount
	default:
		p.Status, p.ApprovedAmount = statusAuthorized, ch.Amount
	}
	return p
}
