package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/payment"
)

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ledger implements payment.Ledger inside one transaction.
type ledger struct {
	q      querier
	events int // events written, so the commit can wake the relay
}

const createAccountSQL = `
INSERT INTO accounts (merchant_id, id, currency, description, metadata)
VALUES ($1, $2, $3, $4, $5)
RETURNING created_at`

func (l *ledger) CreateAccount(ctx context.Context, merchantID uuid.UUID, in payment.NewAccount) (payment.Account, error) {
	a := payment.Account{
		ID:          payment.NewID(),
		MerchantID:  merchantID,
		Currency:    in.Currency,
		Description: in.Description,
		Metadata:    nonNil(in.Metadata),
	}
	err := l.q.QueryRow(ctx, createAccountSQL, merchantID, a.ID, a.Currency, a.Description, a.Metadata).Scan(&a.CreatedAt)
	if err != nil {
		return payment.Account{}, fmt.Errorf("insert account: %w", err)
	}
	return a, l.event(ctx, merchantID, "account", a.ID, payment.EventAccountCreated, a)
}

// depositSQL credits the account and records the deposit in one statement; no
// row comes back when the merchant has no such account.
const depositSQL = `
WITH credited AS (
    UPDATE accounts SET balance = balance + $3
    WHERE merchant_id = $1 AND id = $2
    RETURNING currency
)
INSERT INTO deposits (merchant_id, id, account_id, amount, currency)
SELECT $1, $4, $2, $3, currency FROM credited
RETURNING currency, created_at`

func (l *ledger) Deposit(ctx context.Context, merchantID, accountID uuid.UUID, amount int64) (payment.Deposit, error) {
	d := payment.Deposit{ID: payment.NewID(), AccountID: accountID, Amount: amount}
	err := l.q.QueryRow(ctx, depositSQL, merchantID, accountID, amount, d.ID).Scan(&d.Currency, &d.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return payment.Deposit{}, payment.ErrNotFound
	}
	if err != nil {
		return payment.Deposit{}, fmt.Errorf("insert deposit: %w", err)
	}
	return d, l.event(ctx, merchantID, "deposit", d.ID, payment.EventDepositCreated, d)
}

const (
	// lockChargeSQL reads the charge and locks it until the transaction ends, so
	// the refund decided from it cannot race another refund of the same charge.
	lockChargeSQL = `
SELECT account_id, currency, status, amount, amount_refunded
FROM charges WHERE merchant_id = $1 AND id = $2
FOR UPDATE`

	// refundSQL moves the money back: the charge's refunded amount, the
	// account's balance and the refund row, in one statement.
	refundSQL = `
WITH charge AS (
    UPDATE charges SET amount_refunded = amount_refunded + $3
    WHERE merchant_id = $1 AND id = $2
), credit AS (
    UPDATE accounts SET balance = balance + $3
    WHERE merchant_id = $1 AND id = $4
)
INSERT INTO refunds (merchant_id, id, charge_id, account_id, amount, currency)
VALUES ($1, $5, $2, $4, $3, $6)
RETURNING created_at`
)

func (l *ledger) Refund(ctx context.Context, merchantID, chargeID uuid.UUID, amount *int64) (payment.Refund, error) {
	var (
		r                 = payment.Refund{ID: payment.NewID(), ChargeID: chargeID}
		status            payment.ChargeStatus
		charged, refunded int64
	)
	err := l.q.QueryRow(ctx, lockChargeSQL, merchantID, chargeID).Scan(&r.AccountID, &r.Currency, &status, &charged, &refunded)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return payment.Refund{}, payment.ErrNotFound
	case err != nil:
		return payment.Refund{}, fmt.Errorf("lock charge: %w", err)
	case status != payment.ChargeSucceeded:
		return payment.Refund{}, payment.ErrChargeNotRefundable
	}
	r.Amount = charged - refunded
	if amount != nil {
		r.Amount = *amount
	}
	if r.Amount <= 0 || refunded+r.Amount > charged {
		return payment.Refund{}, payment.ErrRefundExceedsCharge
	}
	err = l.q.QueryRow(ctx, refundSQL, merchantID, chargeID, r.Amount, r.AccountID, r.ID, r.Currency).Scan(&r.CreatedAt)
	if err != nil {
		return payment.Refund{}, fmt.Errorf("insert refund: %w", err)
	}
	return r, l.event(ctx, merchantID, "refund", r.ID, payment.EventRefundCreated, r)
}

const insertEventSQL = `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES ($1, $2, $3, $4, $5, $6)`

// event writes the outbox row for a change, in the change's transaction. Its
// payload is the object's public JSON.
func (l *ledger) event(ctx context.Context, merchantID uuid.UUID, aggregate string, aggregateID uuid.UUID, eventType string, object any) error {
	payload, err := json.Marshal(object)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", eventType, err)
	}
	if _, err := l.q.Exec(ctx, insertEventSQL, merchantID, payment.NewID(), aggregate, aggregateID, eventType, payload); err != nil {
		return fmt.Errorf("insert %s event: %w", eventType, err)
	}
	l.events++
	return nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
