package stripeproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v82"

	"github.com/exactlyonce/payments/internal/processor"
)

// The statuses of processor.Payment, as the use case reads them
// (internal/cards/recovery.go, outcomeOfPayments), from a PaymentIntent's.
const (
	statusAuthorized = "authorized" // requires_capture
	statusCaptured   = "captured"   // succeeded
	statusDeclined   = "declined"   // requires_payment_method, requires_action, requires_confirmation
	statusPending    = "pending"    // processing
	statusVoided     = "voided"     // canceled
)

// Codes of unknown outcomes the adapter names itself.
const (
	codeLookupFailed  = "lookup_failed"
	codeAuthFailed    = "authentication_failed"
	codeTimeout       = "timeout"
	codeConnection    = "connection"
	codeUnreadable    = "unreadable_answer"
	codeRequiresLater = "requires_action"
)

// paymentOf is the processor's view of a PaymentIntent. An intent waiting
// for the customer (requires_action) or for another method
// (requires_payment_method, after a refusal) is declined: this service has
// no step where a customer acts, and nothing was taken.
func paymentOf(pi *stripe.PaymentIntent) processor.Payment {
	p := processor.Payment{PSPReference: pi.ID, Reference: pi.Metadata[metadataReference], Amount: pi.Amount,
		Currency: strings.ToUpper(string(pi.Currency)), CapturedAmount: pi.AmountReceived}
	if pi.Created > 0 {
		p.Created = time.Unix(pi.Created, 0).UTC()
	}
	if pi.PaymentMethod != nil {
		p.PaymentMethod = pi.PaymentMethod.ID
	}
	if pi.LatestCharge != nil {
		p.RefundedAmount = pi.LatestCharge.AmountRefunded
	}
	switch pi.Status {
	case stripe.PaymentIntentStatusRequiresCapture:
		p.Status, p.ApprovedAmount = statusAuthorized, pi.Amount
	case stripe.PaymentIntentStatusSucceeded:
		p.Status, p.ApprovedAmount = statusCaptured, pi.Amount
	case stripe.PaymentIntentStatusProcessing:
		p.Status = statusPending
	case stripe.PaymentIntentStatusCanceled:
		p.Status = statusVoided
	default:
		p.Status, p.DeclineCode = statusDeclined, declineCode(pi)
	}
	return p
}

// declineCode is why an intent did not go through: its last error's decline
// code or code, else its status.
func declineCode(pi *stripe.PaymentIntent) string {
	if e := pi.LastPaymentError; e != nil {
		if e.DeclineCode != "" {
			return string(e.DeclineCode)
		}
		if e.Code != "" {
			return string(e.Code)
		}
	}
	if pi.Status == stripe.PaymentIntentStatusRequiresAction {
		return codeRequiresLater
	}
	return string(pi.Status)
}

// intentResult classifies the answer of a call that returns a
// PaymentIntent.
func (s *Stripe) intentResult(ctx context.Context, call string, pi *stripe.PaymentIntent, err error) processor.Result {
	if err != nil {
		return s.errorResult(ctx, call, err)
	}
	if pi == nil || pi.ID == "" {
		return processor.Result{Outcome: processor.Unknown, Code: codeUnreadable, Err: errors.New("an answer with no payment intent")}
	}
	p := paymentOf(pi)
	switch p.Status {
	case statusAuthorized, statusCaptured:
		return processor.Result{Outcome: processor.Approved, Payment: p}
	case statusPending:
		return processor.Result{Outcome: processor.Pending, Payment: p}
	}
	return processor.Result{Outcome: processor.Declined, Code: p.DeclineCode, Payment: p}
}

// errorResult classifies a failed call, as the port says: a card's refusal
// and a request Stripe refused are final (Declined); everything after which
// Stripe may have done it, or may do it if asked again, is Unknown.
func (s *Stripe) errorResult(ctx context.Context, call string, err error) processor.Result {
	var se *stripe.Error
	if !errors.As(err, &se) {
		code := codeConnection
		var ne interface{ Timeout() bool }
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			code = codeTimeout
		}
		return processor.Result{Outcome: processor.Unknown, Code: code, Err: err}
	}
	r := processor.Result{Err: describe(err)}
	if se.PaymentIntent != nil && se.PaymentIntent.ID != "" {
		r.Payment = paymentOf(se.PaymentIntent)
	}
	switch {
	case se.Type == stripe.ErrorTypeIdempotency:
		// The same key with other parameters: our bug, never the card's.
		// The operation stays open; recovery looks by reference.
		s.log.Error("stripe refused a processor key sent again with other parameters", "call", call, "error", r.Err)
		r.Outcome, r.Code = processor.Unknown, processor.CodeKeyMismatch
	case se.HTTPStatusCode == http.StatusConflict, se.HTTPStatusCode == http.StatusTooManyRequests,
		se.HTTPStatusCode >= 500, se.HTTPStatusCode == 0:
		// In use (409), rate limited or locked (429), Stripe's failure:
		// try later, under the same key.
		r.Outcome, r.Code = processor.Unknown, unknownCode(se)
	case se.HTTPStatusCode == http.StatusUnauthorized, se.HTTPStatusCode == http.StatusForbidden:
		// Our key is wrong: nothing was done, but a customer's charge is
		// not declined for it. It stays open until the key is put right.
		s.log.Error("stripe refused the API key", "call", call, "status", se.HTTPStatusCode)
		r.Outcome, r.Code = processor.Unknown, codeAuthFailed
	default:
		// A card error (402) or a request refused (400, 404): final.
		r.Outcome = processor.Declined
		r.Code = string(se.DeclineCode)
		if r.Code == "" {
			r.Code = string(se.Code)
		}
		if r.Code == "" {
			r.Code = string(se.Type)
		}
	}
	return r
}

func unknownCode(se *stripe.Error) string {
	if se.Code != "" {
		return string(se.Code)
	}
	return "status_" + strconv.Itoa(se.HTTPStatusCode)
}

// describe is err as it may be logged: a Stripe error by its status, type,
// code and message (never a key).
func describe(err error) error {
	var se *stripe.Error
	if !errors.As(err, &se) {
		return err
	}
	return fmt.Errorf("stripe answered %d %s %s: %s (request %s)", se.HTTPStatusCode, se.Type, se.Code, se.Msg, se.RequestID)
}
