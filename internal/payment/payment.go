// Package payment is the domain of the service: accounts, deposits and charges,
// the rules they obey, and the interfaces the storage layer implements. It knows
// neither HTTP nor SQL.
//
// Money is an integer amount of minor units (cents for USD) in an ISO 4217
// currency. An account's balance never goes negative, and at every moment
//
//	balance   = deposits − captured amounts + refunds
//	available = balance − live holds
//
// where a charge's captured amount is all of it when it is captured at once
// (the default), the captured part of an authorization, and 0 for a charge
// that failed or an authorization not (or never) captured; a live hold is an
// authorization neither captured, voided nor past its expires_at
// (authorize.go).
package payment

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Limits on money and on free-form fields.
const (
	MinAmount            = 1
	MaxAmount            = 99_999_999
	MaxDescriptionLength = 1000
	MaxMetadataKeys      = 50
	MaxMetadataKeyLength = 40
	MaxMetadataValueLen  = 500
)

// Account holds a customer's money in one currency.
type Account struct {
	ID         uuid.UUID
	MerchantID uuid.UUID
	Currency   string
	Balance    int64
	// Held is the sum of the account's live holds: Balance minus Held is
	// what a charge or an authorization may take (Available).
	Held        int64
	Description *string
	Metadata    map[string]string
	CreatedAt   time.Time
}

// Available is what a charge or an authorization may take from the account.
func (a Account) Available() int64 { return a.Balance - a.Held }

// Deposit is money added to an account.
type Deposit struct {
	ID        uuid.UUID
	AccountID uuid.UUID
	Amount    int64
	Currency  string
	CreatedAt time.Time
}

// ChargeStatus is the outcome of a charge.
type ChargeStatus string

// The states of a charge. A failed charge moved no money; it is recorded so the
// refusal can be looked up and replayed. An authorized charge holds its amount
// until it is captured (succeeded), voided, or expires (authorize.go).
const (
	ChargeSucceeded  ChargeStatus = "succeeded"
	ChargeFailed     ChargeStatus = "failed"
	ChargeAuthorized ChargeStatus = "authorized"
	ChargeVoided     ChargeStatus = "voided"
	ChargeExpired    ChargeStatus = "expired"
)

// FailureInsufficientFunds is the failure code of a charge refused because the
// account's balance did not cover it. It is spelt as the code of the problem
// the refusal is answered with: machine-readable codes are kebab-case.
// (Events written before migration 0010 spell it insufficient_funds.)
const FailureInsufficientFunds = "insufficient-funds"

// Charge is money taken from an account.
type Charge struct {
	ID uuid.UUID
	// AccountID is the account charged, or uuid.Nil for a card charge,
	// which names its PaymentMethod instead (card.go).
	AccountID     uuid.UUID
	PaymentMethod string
	Amount        int64
	Currency      string
	Status        ChargeStatus
	FailureCode   string // empty unless Status is ChargeFailed
	// DeclineCode is a card charge's reason from the processor
	// (insufficient_funds, ...), when it failed there.
	DeclineCode string
	// AmountCaptured is what the charge took from the balance: Amount for a
	// charge captured at once, the captured part of an authorization, else 0.
	AmountCaptured int64
	AmountRefunded int64
	// ExpiresAt is when an authorization's hold lapses unless captured or
	// voided; nil for a charge created to be captured at once.
	ExpiresAt   *time.Time
	Description *string
	Metadata    map[string]string
	CreatedAt   time.Time
}

// Refund returns part or all of a succeeded charge to its account, or, for
// a card charge, to the card at the processor.
type Refund struct {
	ID        uuid.UUID
	ChargeID  uuid.UUID
	AccountID uuid.UUID // none (uuid.Nil) for a card charge's refund
	Amount    int64
	Currency  string
	// Status is a card charge's refund's state at the processor; an
	// account's refund has none: it is done in its transaction.
	Status    RefundStatus
	CreatedAt time.Time
}

// Event types: one event per money movement, written in the same transaction.
const (
	EventAccountCreated   = "account.created"
	EventDepositCreated   = "deposit.created"
	EventChargeSucceeded  = "charge.succeeded"
	EventChargeFailed     = "charge.failed"
	EventChargeAuthorized = "charge.authorized"
	EventChargeCaptured   = "charge.captured"
	EventChargeVoided     = "charge.voided"
	EventChargeExpired    = "charge.expired"
	EventRefundCreated    = "refund.created"
	// EventWebhookEndpointDisabled says an endpoint was disabled after its
	// deliveries failed for the whole retry period; its data is the
	// endpoint. It moves no money.
	EventWebhookEndpointDisabled = "webhook_endpoint.disabled"
)

// Event records a change: its type and the object it describes, as that object's
// public JSON at the time of the change.
type Event struct {
	ID        uuid.UUID
	Type      string
	Data      json.RawMessage
	CreatedAt time.Time
}

// Page is one page of a list, and whether more items follow it.
type Page[T any] struct {
	Items   []T
	HasMore bool
}

// Limits of list pages.
const (
	DefaultPageSize = 10
	MaxPageSize     = 100
)

// ChargeQuery selects a page of charges, newest first.
type ChargeQuery struct {
	AccountID     *uuid.UUID // nil for every account
	Limit         int
	StartingAfter *uuid.UUID // the last charge of the previous page, or nil
}

// EventQuery selects a page of events, oldest first.
type EventQuery struct {
	Limit         int
	StartingAfter *uuid.UUID // the last event of the previous page, or nil
}

// Ledger moves money. (Charges are decided by ChargeAccount and written in
// batches by the store, not through Ledger.) Its methods run inside the transaction that claimed the
// request's idempotency key, so their effects commit or roll back together with
// the key and the stored response.
type Ledger interface {
	// CreateAccount opens an account with a zero balance.
	CreateAccount(ctx context.Context, merchantID uuid.UUID, in NewAccount) (Account, error)

	// Deposit adds amount to the account. It returns ErrNotFound when the
	// merchant has no such account.
	Deposit(ctx context.Context, merchantID, accountID uuid.UUID, amount int64) (Deposit, error)

	// Refund returns amount of the charge to its account, or all that is not yet
	// refunded when amount is nil. It returns ErrNotFound for an unknown charge,
	// ErrChargeNotRefundable for a failed one, and ErrRefundExceedsCharge when
	// the refunds would add up to more than was captured.
	Refund(ctx context.Context, merchantID, chargeID uuid.UUID, amount *int64) (Refund, error)

	// Capture takes amount of an authorized charge (all of it when amount
	// is nil) from its account and releases the rest of the hold. It returns
	// ErrNotFound for an unknown charge, a *ChargeStateError for a charge
	// that is not authorized (expired included), and
	// ErrCaptureExceedsAuthorization for more than was authorized.
	Capture(ctx context.Context, merchantID, chargeID uuid.UUID, amount *int64) (Charge, error)

	// Void releases an authorized charge's hold. It returns ErrNotFound for
	// an unknown charge and a *ChargeStateError for one not authorized.
	Void(ctx context.Context, merchantID, chargeID uuid.UUID) (Charge, error)

	// CreateWebhookEndpoint records an endpoint that receives the merchant's
	// events (url and events already checked: ValidateWebhookEvents, and the
	// caller's URL guard) and returns it with its secret. It returns
	// ErrTooManyWebhookEndpoints when the merchant already has
	// MaxWebhookEndpoints.
	CreateWebhookEndpoint(ctx context.Context, merchantID uuid.UUID, url string, events []string, secret string) (WebhookEndpoint, error)

	// UpdateWebhookEndpoint changes the merchant's live endpoint as u says
	// (u's URL and events already checked, as for CreateWebhookEndpoint) and
	// returns it, without its secret. Disabling it cancels its pending
	// deliveries; enabling a disabled one resumes its deliveries with the
	// events committed from then on, and says where (Resumed). It returns
	// ErrNotFound for an endpoint the merchant does not have (deleted
	// included).
	UpdateWebhookEndpoint(ctx context.Context, merchantID, endpointID uuid.UUID, u WebhookEndpointUpdate) (WebhookEndpoint, error)

	// ResendWebhookEvent schedules the merchant's event for delivery to the
	// endpoint again, due now: a new pending delivery, or the existing one
	// made pending and due now. It returns ErrNotFound for an endpoint the
	// merchant does not have (deleted included), an event it does not have
	// (or no longer has: pruned), or one the endpoint does not subscribe
	// to, and a *ValidationError for a disabled endpoint.
	ResendWebhookEvent(ctx context.Context, merchantID, endpointID, eventID uuid.UUID) (ScheduledDelivery, error)
}

// Reader looks objects up, always within one merchant: another merchant's object
// is reported as ErrNotFound.
type Reader interface {
	// Account returns the account with its current balance, or ErrNotFound.
	Account(ctx context.Context, merchantID, id uuid.UUID) (Account, error)

	// Deposit returns a deposit into the given account, or ErrNotFound.
	Deposit(ctx context.Context, merchantID, accountID, id uuid.UUID) (Deposit, error)

	// Charge returns the charge, or ErrNotFound.
	Charge(ctx context.Context, merchantID, id uuid.UUID) (Charge, error)

	// Charges returns a page of charges, newest first. A StartingAfter that
	// names no charge of the merchant is a *ValidationError; an AccountID the
	// merchant does not have is ErrNotFound.
	Charges(ctx context.Context, merchantID uuid.UUID, q ChargeQuery) (Page[Charge], error)

	// Refund returns a refund of the given charge, or ErrNotFound.
	Refund(ctx context.Context, merchantID, chargeID, id uuid.UUID) (Refund, error)

	// Events returns a page of the merchant's events, oldest first. An event
	// appears once every transaction that started before its own has finished,
	// so a reader paging with StartingAfter never skips one. A StartingAfter
	// that names no event of the merchant is a *ValidationError.
	Events(ctx context.Context, merchantID uuid.UUID, q EventQuery) (Page[Event], error)

	// Event returns one event as Events lists it, or ErrNotFound while
	// Events would not list it: not the merchant's, not yet listed (a
	// transaction older than its own still runs), or pruned.
	Event(ctx context.Context, merchantID, id uuid.UUID) (Event, error)
}
