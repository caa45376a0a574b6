package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/payment"
)

// Inbox is the consumer's own state in the service's database: the inbox of
// events it applied (migration 0003) and its effect, the balance projection.
// The consumer owns these tables and their SQL; the store knows nothing of them.
type Inbox struct {
	db Database
}

// Database is what the inbox needs of the service's database
// (postgres.DB): transactions whose commit the synchronous standby has
// confirmed, so that the consumer acknowledges an event to NATS only once a
// failover can no longer lose its effect.
type Database interface {
	// Begin begins a transaction whose commit is acknowledged only once
	// confirmed; its Rollback, deferred, ends it.
	Begin(ctx context.Context) (pgx.Tx, error)
	// Confirm returns once everything committed before it is confirmed.
	Confirm(ctx context.Context) error
	Pool() *pgxpool.Pool
}

// NewInbox returns the inbox in db.
func NewInbox(db Database) *Inbox { return &Inbox{db: db} }

// BalanceEffect is what one event does to the balance projection.
type BalanceEffect struct {
	MerchantID uuid.UUID
	EventID    uuid.UUID
	// AccountID is the account whose balance the event is about, or
	// uuid.Nil for an event about none (webhook_endpoint.disabled): that
	// one is recorded in the inbox and projects nothing.
	AccountID uuid.UUID
	Delta     int64
}

const (
	inboxSQL = `
INSERT INTO inbox (merchant_id, consumer, event_id) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING`

	projectBalanceSQL = `
INSERT INTO account_balances (merchant_id, account_id, balance, events)
VALUES ($1, $2, $3, 1)
ON CONFLICT (merchant_id, account_id)
DO UPDATE SET balance = account_balances.balance + $3, events = account_balances.events + 1`
)

// ApplyOnce applies an event's effect for consumer unless it already has: the
// inbox row and the effect commit together. It reports whether this call
// applied it (false for a redelivery). It returns only once the synchronous
// standby has the effect, this call's or an earlier one's: an earlier
// attempt's commit may be there on the primary alone (its wait cancelled),
// and a redelivery found in the inbox must not be acknowledged on its word.
func (in *Inbox) ApplyOnce(ctx context.Context, consumer string, e BalanceEffect) (bool, error) {
	applied, err := in.apply(ctx, consumer, e)
	if err == nil && !applied {
		// Seen before: this transaction wrote nothing, so its commit
		// confirmed nothing.
		err = in.db.Confirm(ctx)
	}
	return applied, err
}

// apply writes the inbox row and, for an event not seen before, its effect,
// in one transaction, and reports whether it applied the event.
func (in *Inbox) apply(ctx context.Context, consumer string, e BalanceEffect) (bool, error) {
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after a commit, only releases it
	tag, err := tx.Exec(ctx, inboxSQL, e.MerchantID, consumer, e.EventID)
	if err != nil {
		return false, fmt.Errorf("insert inbox row: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, tx.Commit(ctx) // seen before
	}
	if e.AccountID != uuid.Nil { // uuid.Nil: about no account
		if _, err := tx.Exec(ctx, projectBalanceSQL, e.MerchantID, e.AccountID, e.Delta); err != nil {
			return false, fmt.Errorf("project balance: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// ProjectedBalance returns the consumer's view of an account's balance and how
// many events built it, or payment.ErrNotFound.
func (in *Inbox) ProjectedBalance(ctx context.Context, merchantID, accountID uuid.UUID) (balance, events int64, err error) {
	err = in.db.Pool().QueryRow(ctx, `SELECT balance, events FROM account_balances WHERE merchant_id = $1 AND account_id = $2`,
		merchantID, accountID).Scan(&balance, &events)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, payment.ErrNotFound
	}
	if err != nil {
		return 0, 0, fmt.Errorf("projected balance: %w", err)
	}
	return balance, events, nil
}
