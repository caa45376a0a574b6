package client

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Problem is an RFC 9457 problem+json answer of the service, returned as an
// error. Program against Status and Code (the table of codes is in
// openapi.yaml); Title and Detail are for people:
//
//	var p *client.Problem
//	if errors.As(err, &p) && p.Code == client.CodeInsufficientFunds { ... }
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// Field names the request field to blame, when one is (invalid-request).
	Field string `json:"field,omitempty"`
	// ChargeID is the charge that insufficient-funds, card-declined,
	// card-charge-failed or charge-reversed recorded.
	ChargeID string `json:"charge_id,omitempty"`
	// DeclineCode is the card processor's reason for a card-declined
	// ("insufficient_funds", "do_not_honor", ...).
	DeclineCode string `json:"decline_code,omitempty"`
	// ChargeStatus is the status of the charge that charge-not-capturable
	// or charge-not-voidable refused ("succeeded", "expired", ...).
	ChargeStatus string `json:"charge_status,omitempty"`

	// RetryAfter is the response's Retry-After, zero when it had none.
	RetryAfter time.Duration `json:"-"`
	// RequestID is the X-Request-Id of the response that carried the
	// problem: quote it when you report an issue.
	RequestID string `json:"-"`
	// Replayed says the problem is a stored refusal replayed for a retry of
	// the same operation (Idempotent-Replayed: true).
	Replayed bool `json:"-"`
}

// The problem codes a program is most likely to switch on; openapi.yaml lists
// them all, and new ones may be added.
const (
	CodeInvalidRequest              = "invalid-request"
	CodeUnauthorized                = "unauthorized"
	CodeInsufficientFunds           = "insufficient-funds"
	CodeNotFound                    = "not-found"
	CodeAccountNotFound             = "account-not-found"
	CodeKeyInUse                    = "idempotency-key-in-use"
	CodeKeyReused                   = "idempotency-key-reused"
	CodeChargeNotRefundable         = "charge-not-refundable"
	CodeChargeNotCapturable         = "charge-not-capturable"
	CodeChargeNotVoidable           = "charge-not-voidable"
	CodeCurrencyMismatch            = "currency-mismatch"
	CodeRefundExceedsCharge         = "refund-exceeds-charge"
	CodeInternalError               = "internal-error"
	CodeServiceUnavailable          = "service-unavailable"
	CodeCaptureExceedsAuthorization = "capture-exceeds-authorization"
	CodeTooManyWebhookEndpoints     = "too-many-webhook-endpoints"
	// A card charge's refusals (see CreateCharge).
	CodeCardDeclined           = "card-declined"
	CodeCardChargeFailed       = "card-charge-failed"
	CodeChargeReversed         = "charge-reversed"
	CodeNoCardProcessor        = "no-card-processor"
	CodeProcessorNotConfigured = "processor-not-configured"
	// A capture, void or refund of a card charge: another capture or void
	// of it is in flight (ChargeStatus is what the charge reads until it
	// ends), or the processor refused it (DeclineCode says why).
	CodeChargeOperationInProgress = "charge-operation-in-progress"
	CodeProcessorDeclined         = "processor-declined"
)

func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "payments: %d %s", p.Status, p.Code)
	if p.Detail != "" {
		fmt.Fprintf(&b, ": %s", p.Detail)
	}
	if p.RequestID != "" {
		fmt.Fprintf(&b, " (request %s)", p.RequestID)
	}
	return b.String()
}

// ErrGaveUp is wrapped by the error of an operation that stopped retrying
// because its attempts or its total time ran out, or its context ended. The
// same error wraps the last attempt's outcome (a *Problem or a transport
// error), so errors.As still finds it.
var ErrGaveUp = errors.New("payments: gave up retrying")

// RetryError is the error of an operation that stopped retrying. It wraps
// ErrGaveUp, the reason it stopped (context.DeadlineExceeded, for instance)
// when there is one, and the last attempt's outcome.
type RetryError struct {
	Attempts   int      // how many requests were sent
	RequestIDs []string // the X-Request-Id of every attempt, as in Result.RequestIDs
	Last       error    // the last attempt's outcome: a *Problem or a transport error
	Cause      error    // why it stopped, when not the attempt cap: the context's error
}

func (e *RetryError) Error() string {
	why := "attempts exhausted"
	if e.Cause != nil {
		why = e.Cause.Error()
	}
	return fmt.Sprintf("payments: gave up after %d attempt(s) (%s); last: %v", e.Attempts, why, e.Last)
}

// Unwrap lets errors.Is and errors.As see ErrGaveUp, the cause and the last outcome.
func (e *RetryError) Unwrap() []error {
	errs := []error{ErrGaveUp}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Last != nil {
		errs = append(errs, e.Last)
	}
	return errs
}
