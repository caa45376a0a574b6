package payment

import (
	"errors"
	"fmt"
	"time"
)

// Errors the domain reports. The HTTP layer maps each to a problem type.
var (
	// ErrNotFound: the merchant has no such object.
	ErrNotFound = errors.New("not found")

	// ErrAccountNotFound: a charge names an account the merchant does not have.
	ErrAccountNotFound = errors.New("account not found")

	// ErrCurrencyMismatch: a charge's currency differs from its account's.
	ErrCurrencyMismatch = errors.New("currency does not match the account's")

	// ErrRefundExceedsCharge: the refunds of a charge would add up to more than
	// was charged (or nothing is left to refund).
	ErrRefundExceedsCharge = errors.New("refund exceeds what is left of the charge")

	// ErrChargeNotRefundable: the charge failed, so there is nothing to refund.
	ErrChargeNotRefundable = errors.New("charge did not succeed and cannot be refunded")

	// ErrInsufficientFunds: the balance did not cover a charge, which is
	// recorded as failed (see FailedCharge).
	ErrInsufficientFunds = errors.New("insufficient funds")

	// ErrUnauthenticated: the API key is missing or unknown.
	ErrUnauthenticated = errors.New("unauthenticated")

	// ErrUnavailable: the database cannot be reached or is overloaded; nothing
	// was changed and the request may be retried.
	ErrUnavailable = errors.New("temporarily unavailable")

	// ErrTooManyUnknownKeys: the caller's address sent more API keys that
	// turned out unknown than the service looks up for it; its key was not
	// checked. A *RetryAfter says when to try again.
	ErrTooManyUnknownKeys = errors.New("too many unknown API keys")

	// ErrRateLimited: the merchant sent more requests of its kind (reads or
	// writes) than this replica serves it a second; the request was not
	// looked at. A *RetryAfter says when to try again.
	ErrRateLimited = errors.New("rate limited")

	// ErrShuttingDown: the process has been asked to stop and is leaving
	// its load balancer's rotation; it still serves what it is sent.
	ErrShuttingDown = errors.New("shutting down")
)

// ValidationError reports a request that breaks the rules on money or fields.
// It is found before anything is claimed or written.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Message)
}

// Invalid returns a *ValidationError for field, its message formatted.
func Invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// FailedCharge is the refusal of a charge the balance did not cover: the
// charge exists, with status ChargeFailed. It is an ErrInsufficientFunds.
type FailedCharge struct{ Charge Charge }

func (e *FailedCharge) Error() string {
	return fmt.Sprintf("the balance of account %s does not cover %d %s",
		FormatID(PrefixAccount, e.Charge.AccountID), e.Charge.Amount, e.Charge.Currency)
}

// Unwrap makes a FailedCharge an ErrInsufficientFunds.
func (e *FailedCharge) Unwrap() error { return ErrInsufficientFunds }

// RetryAfter is a refusal that ends: nothing was done, and a retry after After
// may succeed. It is the error it wraps.
type RetryAfter struct {
	Err   error
	After time.Duration
}

func (e *RetryAfter) Error() string { return e.Err.Error() }

// Unwrap makes a RetryAfter the error it wraps.
func (e *RetryAfter) Unwrap() error { return e.Err }
