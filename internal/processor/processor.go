// Package processor is the port to a card processor: authorize (capture now
// or later), capture, void, refund, look up by our reference, reverse by our
// reference. Every operation's result is one of four outcomes, and Unknown is
// a real one: the processor may have done it. Simulator is its adapter for
// the simulator (cmd/procsim); docs/processors.md describes both.
package processor

import (
	"context"
	"errors"
	"time"
)

// Outcome is what a call to the processor is known to have done.
type Outcome string

// The outcomes. Only Approved and Declined are final; Pending is decided
// later by the processor (a webhook, a lookup); Unknown was perhaps done:
// resolve it by a lookup by our reference, a same-key retry or a reversal.
const (
	Approved Outcome = "approved"
	Declined Outcome = "declined" // final, with a Code
	Pending  Outcome = "pending"
	Unknown  Outcome = "unknown" // a timeout, a reset or a 5xx after the request was written
)

// Payment is the processor's view of one authorization.
type Payment struct {
	PSPReference   string `json:"psp_reference"`
	Reference      string `json:"reference"`
	PaymentMethod  string `json:"payment_method"`
	Status         string `json:"status"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	DeclineCode    string `json:"decline_code"`
	ApprovedAmount int64  `json:"approved_amount"`
	CapturedAmount int64  `json:"captured_amount"`
	RefundedAmount int64  `json:"refunded_amount"`
	// Created is when the processor created it (set by Records.Payments;
	// zero where an adapter's answer does not say).
	Created time.Time `json:"created"`
}

// Result is the result of one operation.
type Result struct {
	Outcome Outcome
	// Code is the processor's code of a Declined result (insufficient_funds,
	// invalid_state, ...), or what made a result Unknown (timeout,
	// connection, status_503, ...).
	Code string
	// Payment is the payment as the processor answered it; zero when Unknown.
	Payment Payment
	// Payments are the payments a reversal covered.
	Payments []Payment
	// Err is the cause of an Unknown result, when it was an error.
	Err error
}

// Authorization is what to authorize.
type Authorization struct {
	// Key is the processor's idempotency key: derived from our operation, the
	// same on every attempt of it, never the merchant's key.
	Key           string
	Reference     string // ours, committed before the call
	Amount        int64
	Currency      string
	PaymentMethod string
	Capture       bool // capture now; false authorizes only
}

// CodeKeyMismatch is the Code of an Unknown result the processor gave
// because our processor key came again with other parameters: a bug of
// ours, never the card's decline. The use case counts them for an alert.
const CodeKeyMismatch = "idempotency_key_mismatch"

// ErrUnknown wraps a lookup that did not get an answer.
var ErrUnknown = errors.New("processor: outcome unknown")

// Processor is the port. Each writing operation takes the processor key of
// our operation, so that a retry never does it twice.
type Processor interface {
	// Name identifies the processor (its kind and where, or which account):
	// every operation records the one it was sent to, and only that one is
	// ever asked about it again. Asked about an operation it never got,
	// another would answer "not found", and a re-drive there would charge
	// the card twice.
	Name() string
	Authorize(ctx context.Context, a Authorization) Result
	Capture(ctx context.Context, key, pspReference string, amount int64) Result
	Void(ctx context.Context, key, pspReference string) Result
	Refund(ctx context.Context, key, pspReference string, amount int64) Result
	// Lookup returns the payments carrying our reference, or an error
	// wrapping ErrUnknown. None found proves nothing before the processor's
	// decision deadline.
	Lookup(ctx context.Context, reference string) ([]Payment, error)
	// Reverse cancels or refunds whatever was done under our reference:
	// Approved when the processor accepted it.
	Reverse(ctx context.Context, key, reference string) Result
}

// Records is a processor's own records, for reconciliation (payments
// reconcile): what it did, whatever our side knows.
type Records interface {
	// Payments returns every payment the processor created in [since,
	// until), with our reference where it has one, paging through them
	// all. An error wraps ErrUnknown when the processor did not answer.
	Payments(ctx context.Context, since, until time.Time) ([]Payment, error)
}
