package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"payments/internal/payment"
)

const (
	accountSQL = `
SELECT id, merchant_id, currency, balance, description, metadata, created_at
FROM accounts WHERE merchant_id = $1 AND id = $2`

	depositByIDSQL = `
SELECT id, account_id, amount, currency, created_at
FROM deposits WHERE merchant_id = $1 AND account_id = $2 AND id = $3`

	chargeSQL = `
SELECT id, account_id, amount, currency, status, coalesce(failure_code, ''), amount_refunded,
       description, metadata, created_at
FROM charges WHERE merchant_id = $1 AND id = $2`
)

// Account returns the merchant's account with its current balance, or
// payment.ErrNotFound.
func (s *Store) Account(ctx context.Context, merchantID, id uuid.UUID) (payment.Account, error) {
	var a payment.Account
	err := s.pool.QueryRow(ctx, accountSQL, merchantID, id).
		Scan(&a.ID, &a.MerchantID, &a.Currency, &a.Balance, &a.Description, &a.Metadata, &a.CreatedAt)
	return a, readErr("account", err)
}

// Deposit returns a deposit into the merchant's account, or payment.ErrNotFound.
func (s *Store) Deposit(ctx context.Context, merchantID, accountID, id uuid.UUID) (payment.Deposit, error) {
	var d payment.Deposit
	err := s.pool.QueryRow(ctx, depositByIDSQL, merchantID, accountID, id).
		Scan(&d.ID, &d.AccountID, &d.Amount, &d.Currency, &d.CreatedAt)
	return d, readErr("deposit", err)
}

// Charge returns the merchant's charge, or payment.ErrNotFound.
func (s *Store) Charge(ctx context.Context, merchantID, id uuid.UUID) (payment.Charge, error) {
	var c payment.Charge
	err := s.pool.QueryRow(ctx, chargeSQL, merchantID, id).
		Scan(&c.ID, &c.AccountID, &c.Amount, &c.Currency, &c.Status, &c.FailureCode, &c.AmountRefunded,
			&c.Description, &c.Metadata, &c.CreatedAt)
	return c, readErr("charge", err)
}

func readErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return payment.ErrNotFound
	default:
		return interpret(fmt.Errorf("select %s: %w", what, err))
	}
}
