package payment

import (
	"errors"
	"fmt"
	"time"
)

// Authorize now, capture later. A charge created with Authorize holds its
// amount on the account (Account.Held) until one of these, whichever comes
// first:
//
//   - a capture takes part or all of it from the balance (status succeeded,
//     AmountCaptured) and releases the rest;
//   - a void releases all of it (status voided);
//   - its ExpiresAt passes: from that instant it is expired and holds
//     nothing, whatever has yet been written; a sweep records the state and
//     its event later.
//
// The decisions below are made by the caller holding the charge's account
// locked, with a clock read after the lock was taken (see
// internal/postgres/ledger.go), so an expiry a spender already counted on is
// never undone by a capture.

// Errors of captures and voids.
var (
	// ErrChargeNotCapturable: only an authorized charge can be captured.
	ErrChargeNotCapturable = errors.New("charge is not authorized and cannot be captured")
	// ErrChargeNotVoidable: only an authorized charge can be voided.
	ErrChargeNotVoidable = errors.New("charge is not authorized and cannot be voided")
	// ErrCaptureExceedsAuthorization: a capture asked for more than the
	// authorized amount.
	ErrCaptureExceedsAuthorization = errors.New("capture exceeds the authorized amount")
)

// ChargeStateError refuses a capture or a void of a charge that is not
// authorized, or a capture, a void or a refund of a card charge, saying what
// it is. It is the error Op names: ErrChargeNotCapturable,
// ErrChargeNotVoidable or ErrChargeNotRefundable.
type ChargeStateError struct {
	Op     error
	Charge Charge
}

func (e *ChargeStateError) Error() string {
	verb := "captured"
	switch {
	case errors.Is(e.Op, ErrChargeNotVoidable):
		verb = "voided"
	case errors.Is(e.Op, ErrChargeNotRefundable):
		verb = "refunded"
	}
	if e.Charge.IsCard() {
		return cardChargeStateMessage(e.Charge, verb)
	}
	return fmt.Sprintf("charge %s is %s; only an authorized charge can be %s",
		FormatID(PrefixCharge, e.Charge.ID), e.Charge.Status, verb)
}

// Unwrap makes a ChargeStateError the error its Op names.
func (e *ChargeStateError) Unwrap() error { return e.Op }

// At returns the charge as it stands at t: an authorization whose ExpiresAt
// is not after t is expired.
func (c Charge) At(t time.Time) Charge {
	if c.Status == ChargeAuthorized && c.ExpiresAt != nil && !c.ExpiresAt.After(t) {
		c.Status = ChargeExpired
	}
	return c
}

// Holds reports whether the charge holds its amount at t.
func (c Charge) Holds(t time.Time) bool { return c.At(t).Status == ChargeAuthorized }

// CaptureCharge decides a capture of amount (nil: all that was authorized)
// of c at t. It returns the captured charge; the balance loses
// AmountCaptured and the hold (c.Amount) is released.
func CaptureCharge(c Charge, amount *int64, t time.Time) (Charge, error) {
	if c = c.At(t); c.Status != ChargeAuthorized {
		return Charge{}, &ChargeStateError{Op: ErrChargeNotCapturable, Charge: c}
	}
	n := c.Amount
	if amount != nil {
		n = *amount
	}
	if n > c.Amount {
		return Charge{}, fmt.Errorf("%w: %d asked, %d %s authorized", ErrCaptureExceedsAuthorization, n, c.Amount, c.Currency)
	}
	c.Status, c.AmountCaptured = ChargeSucceeded, n
	return c, nil
}

// VoidCharge decides a void of c at t. It returns the voided charge; the hold
// (c.Amount) is released.
func VoidCharge(c Charge, t time.Time) (Charge, error) {
	if c = c.At(t); c.Status != ChargeAuthorized {
		return Charge{}, &ChargeStateError{Op: ErrChargeNotVoidable, Charge: c}
	}
	c.Status = ChargeVoided
	return c, nil
}
