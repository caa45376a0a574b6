package carddb

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// Captures, voids and refunds of a card charge: operations at the processor
// that follow its authorization, each with its own id (a refund's is the
// refund's), started by a keyed write (FollowUpTx) and ended by a
// compare-and-set (FollowUps.Settle).

// The kinds of the operations that follow an authorization.
const (
	KindCapture = payment.OperationCapture
	KindVoid    = payment.OperationVoid
	KindRefund  = payment.OperationRefund
)

// LockedCharge is a card charge as the keyed write of a capture, void or
// refund reads it, under the charge's row lock.
type LockedCharge struct {
	Charge payment.Charge
	// PSPReference is the processor's reference of its authorization, and
	// Processor the processor it was sent to ("" if it names none).
	PSPReference, Processor string
	// Refunding is the amount of its refunds in flight (pending).
	Refunding int64
	// Settling is the kind of its capture or void in flight or in review,
	// if any.
	Settling string
	// Now is the transaction's clock.
	Now time.Time
}

// FollowUp is what the keyed write of a capture, void or refund inserts:
// the operation, in processing, and for a refund its row, pending.
type FollowUp struct {
	Op Operation
	// ReviewAfter and CheckAfter are when the operation, still unknown,
	// goes to review, and its first check, after the transaction's clock.
	ReviewAfter, CheckAfter time.Duration
	// Refund, for a refund, is the refund to insert, pending.
	Refund *payment.Refund
}

// FollowUpTx is the work of the keyed write that starts a capture, void or
// refund, in the transaction that claims its key.
type FollowUpTx interface {
	// LockCardCharge locks the merchant's card charge and returns it, or
	// payment.ErrNotFound (an account's charge included).
	LockCardCharge(ctx context.Context, merchant, id uuid.UUID) (LockedCharge, error)
	// InsertFollowUp inserts f.Op (and f.Refund); it returns the
	// transaction's clock, their created_at.
	InsertFollowUp(ctx context.Context, f FollowUp) (time.Time, error)
}

// Settlement is one change of a capture's, void's or refund's state,
// written in one transaction only if the operation is still in From: the
// operation, its charge's change, its refund's status, the change's event
// and, if Answer is set, the key's final response.
type Settlement struct {
	Merchant, Operation uuid.UUID
	From, To            State
	// Charge, when set, is the charge's new status and amount_captured.
	Charge *payment.Charge
	// Refunded is added to the charge's amount_refunded.
	Refunded int64
	// RefundStatus, when set, is the refund's (the operation's) new
	// status.
	RefundStatus payment.RefundStatus
	// CheckAfter is when recovery looks next if To is processing.
	CheckAfter time.Duration
	Attempts   int
	LastCode   string
	// Event is the change's event about the aggregate (charge, refund);
	// none when its Type is "".
	Event            Event
	EventAggregate   string
	EventAggregateID uuid.UUID
	Answer           *idempotency.Response
}

// FollowUps is the database side of captures, voids and refunds.
type FollowUps interface {
	// Settle writes s if the operation is still in s.From, and reports
	// whether it did.
	Settle(ctx context.Context, s Settlement) (Written, error)
	// Refund returns the merchant's refund, or payment.ErrNotFound.
	Refund(ctx context.Context, merchant, id uuid.UUID) (payment.Refund, error)
}
