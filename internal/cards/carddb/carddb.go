// Package carddb is the boundary between the card charge use case
// (internal/cards) and the database that keeps its rows, as chargedb is for
// account charges: the use case declares here what it needs, in plain types,
// and internal/postgres implements it with SQL. Nothing here decides
// anything, and the store runs nothing of its caller's inside a transaction:
// the keyed write that starts a charge is idempotency.Keys's algorithm over
// Store's transactions, whose Work is Tx.
package carddb

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// State is a processor operation's state.
type State string

// The states of an operation. Processing and Reversing are open: recovery
// checks them at NextCheckAt. The others are final, but for an approval that
// arrives after Failed or Reversed, which reverses it again.
const (
	Processing     State = "processing"
	Succeeded      State = "succeeded"
	Failed         State = "failed"
	Reversing      State = "reversing"
	Reversed       State = "reversed"
	RequiresReview State = "requires_review"
)

// KindAuthorize is the kind of an authorization, the operation that creates
// a card charge (its id is the charge's).
const KindAuthorize = "authorize"

// Operation is one operation at the processor, with its charge as stored.
type Operation struct {
	Merchant, ID, ChargeID uuid.UUID
	Kind                   string
	State                  State
	// Processor names the processor the operation was sent to
	// (processor.Processor.Name); "" for one made before operations named
	// theirs. Only that processor is ever asked about it.
	Processor string
	// ProcessorKey is the processor's idempotency key: derived from ID and
	// Kind, the same on every attempt, never the merchant's key.
	ProcessorKey     string
	Amount           int64
	Currency         string
	PaymentMethod    string
	Capture          bool
	PSPReference     string
	DecisionDeadline time.Time
	NextCheckAt      *time.Time
	Attempts         int
	ReversalAttempts int
	ReversalRound    int
	LastCode         string
	CreatedAt        time.Time
	// Charge is the operation's charge as stored.
	Charge payment.Charge
	// Now is the database's clock when the operation was read.
	Now time.Time
}

// Start is what the keyed write that starts a card charge inserts after its
// charge: the operation, in processing, and the charge.processing event.
type Start struct {
	Op Operation
	// DecisionAfter and CheckAfter are the operation's decision deadline
	// and first check, after the transaction's clock.
	DecisionAfter, CheckAfter time.Duration
	Event                     Event
}

// Event is an event to write with a change, in its transaction.
type Event struct {
	ID      uuid.UUID
	Type    string
	Payload []byte // the charge's public JSON
}

// Tx is the work of the keyed write that starts a card charge, in the
// transaction that claims its key. A store may send an insert with the
// commit: an error of it is then the commit's, and nothing is written.
type Tx interface {
	// InsertCharge inserts c, in processing, and returns the
	// transaction's clock, its created_at.
	InsertCharge(ctx context.Context, merchant uuid.UUID, c payment.Charge) (time.Time, error)
	// InsertOperation inserts s.Op, its deadlines counted from the
	// transaction's clock, and s.Event.
	InsertOperation(ctx context.Context, s Start) error
	// FollowUpTx starts captures, voids and refunds (followup.go).
	FollowUpTx
}

// Transition is one change of an operation's state, written in one
// transaction only if the operation is still in From (a compare-and-set:
// whoever resolves an operation first wins, a loser changes nothing): the
// operation's new state and bookkeeping, its charge as it now is, the
// change's event and, if Answer is set, the key's final response.
type Transition struct {
	Merchant, Operation uuid.UUID
	From, To            State
	// Charge is the charge after the change; its status, failure and
	// decline codes and captured amount are written.
	Charge       payment.Charge
	PSPReference string
	// CheckAfter is when recovery looks next, after the transaction's
	// clock, if To is open (processing, reversing); a final state has no
	// next check.
	CheckAfter       time.Duration
	Attempts         int
	ReversalAttempts int
	ReversalRound    int
	LastCode         string
	// Event is the change's event; none when Type is "" (a check that
	// changed no state).
	Event Event
	// Answer, when set, is stored under the key bound to the operation, if
	// that key has no response yet.
	Answer *idempotency.Response
	// Inbound, when its ID is set, is the processor's event that brought
	// the change: recorded with it, and the change is not written if it
	// was recorded before (ErrDuplicateEvent).
	Inbound Inbound
	// Resolution, when set, is the operator's settlement that brought the
	// change (out of RequiresReview): its audit row is written with the
	// change, in its transaction, and only if the change is.
	Resolution *Resolution
}

// Resolution is an operator's settlement of an operation in review, as its
// audit keeps it: the state it left is the transition's From, the status
// its charge took the transition's Charge.Status, and its time the
// transaction's clock.
type Resolution struct {
	ID uuid.UUID
	// As is what the operator found the processor did: "succeeded" (it
	// kept the money) or "failed" (it did not).
	As               string
	Reason, Operator string
}

// Inbound is a processor's event (a webhook), by the processor's id.
type Inbound struct{ ID, Type string }

// ErrDuplicateEvent is a processor's event recorded before: it was applied
// already.
var ErrDuplicateEvent = errors.New("carddb: the processor's event was recorded before")

// Written is what a compare-and-set (Transition, Settle) did: whether it
// was applied, and, when it stored the key's response, when (by the
// database's clock); zero when it stored none (none was given, or the key
// had one).
type Written struct {
	Applied    bool
	AnsweredAt time.Time
}

// Status is what a request bound to an operation answers from: the key's
// response once stored, and the charge as it stands.
type Status struct {
	Answered bool
	Answer   idempotency.Response
	StoredAt time.Time
	Charge   payment.Charge
}

// Store is the database side of card charges. Its errors are
// payment.ErrUnavailable (the database is not there) and the driver's own.
type Store interface {
	idempotency.Store[Tx]
	// Operation returns the merchant's operation with its charge, or
	// payment.ErrNotFound.
	Operation(ctx context.Context, merchant, id uuid.UUID) (Operation, error)
	// OperationByReference returns the operation our reference names,
	// whatever its merchant, or payment.ErrNotFound.
	OperationByReference(ctx context.Context, id uuid.UUID) (Operation, error)
	// Transition writes t if the operation is still in t.From, and reports
	// whether it did.
	Transition(ctx context.Context, t Transition) (Written, error)
	// Status returns what a request bound to the operation answers from;
	// a stored response only once the standby has it.
	Status(ctx context.Context, merchant, id uuid.UUID) (Status, error)
	// Claim leases up to limit operations of processor (and those that
	// name none) due for a check (their NextCheckAt passed), skipping
	// those another claim holds: each one's
	// NextCheckAt moves lease ahead, committed before Claim returns, so
	// the caller works on them holding nothing.
	Claim(ctx context.Context, processor string, lease time.Duration, limit int) ([]Operation, error)
	// RecordEvent records a processor's event that changes nothing, for
	// the merchant's operation; it reports false when it was recorded
	// before (a duplicate delivery).
	RecordEvent(ctx context.Context, merchant, op uuid.UUID, in Inbound) (bool, error)
	// Open counts the open operations (processing or reversing) and those
	// in review, with the age of the oldest open one.
	Open(ctx context.Context) (OpenOperations, error)
	// FollowUps ends captures, voids and refunds (followup.go).
	FollowUps
}

// OpenOperations is what Store.Open counts.
type OpenOperations struct {
	Open, InReview int
	Oldest         time.Duration
}
