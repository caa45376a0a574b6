package idempotency

import (
	"context"

	"github.com/exactlyonce/payments/internal/payment"
)

// The ports through which the HTTP layer hands work on, so that it needs no
// storage package: a step runs under a claimed key in the store; a charge is
// decided by the charge path (internal/charging) and written by its store,
// its response rendered by the ChargeRenderer it carries.

// Step is the business step guarded by an idempotency key. It runs in the
// transaction that claimed the key and returns the response to store. A
// business refusal that must be replayed is a Response (for example a 404),
// not an error; an error rolls everything back, key included.
type Step func(ctx context.Context, l payment.Ledger) (Response, error)

// ChargeRenderer turns a decided charge into the response stored under its
// key: c is the charge, body its public JSON (also its event's data), and err
// is payment.ErrAccountNotFound or payment.ErrCurrencyMismatch when the charge
// was refused before it existed. An error from it fails the request, storing
// nothing.
type ChargeRenderer func(c payment.Charge, body []byte, err error) (Response, error)

// ChargeRequest is one charge to execute under its idempotency key.
type ChargeRequest struct {
	Request Request
	Charge  payment.NewCharge
	Render  ChargeRenderer
}
