// Package payment is the domain of the service: accounts, deposits and charges,
// the rules they obey, and the interfaces the storage layer implements. It knows
// neither HTTP nor SQL.
//
// Money is an integer amount of minor units (cents for USD) in an ISO 4217
// currency. An account's balance never goes negative, and at every moment
//
//	balance = deposits − succeeded charges + refunds.
package payment

import (
	"context"
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
	ID          uuid.UUID
	MerchantID  uuid.UUID
	Currency    string
	Balance     int64
	Description *string
	Metadata    map[string]string
	CreatedAt   time.Time
}

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

// The outcomes of a charge. A failed charge moved no money; it is recorded so the
// refusal can be looked up and replayed.
const (
	ChargeSucceeded ChargeStatus = "succeeded"
	ChargeFailed    ChargeStatus = "failed"
)

// FailureInsufficientFunds is the failure code of a charge refused because the
// account's balance did not cover it.
const FailureInsufficientFunds = "insufficient_funds"

// Charge is money taken from an account.
type Charge struct {
	ID             uuid.UUID
	AccountID      uuid.UUID
	Amount         int64
	Currency       string
	Status         ChargeStatus
	FailureCode    string // empty unless Status is ChargeFailed
	AmountRefunded int64
	Description    *string
	Metadata       map[string]string
	CreatedAt      time.Time
}

// Ledger moves money. Its methods run inside the transaction that claimed the
// request's idempotency key, so their effects commit or roll back together with
// the key and the stored response.
type Ledger interface {
	// CreateAccount opens an account with a zero balance.
	CreateAccount(ctx context.Context, merchantID uuid.UUID, in NewAccount) (Account, error)

	// Deposit adds amount to the account. It returns ErrNotFound when the
	// merchant has no such account.
	Deposit(ctx context.Context, merchantID, accountID uuid.UUID, amount int64) (Deposit, error)

	// Charge takes in.Amount from the account if its balance covers it. When it
	// does not, the charge is recorded with status ChargeFailed and returned with
	// a nil error. It returns ErrAccountNotFound when the merchant has no such
	// account and ErrCurrencyMismatch when the account holds another currency.
	Charge(ctx context.Context, merchantID uuid.UUID, in NewCharge) (Charge, error)
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
}
