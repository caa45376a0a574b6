package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
	// lockChargeAccountSQL locks the account of a charge, first: the lock
	// order is accounts, then charges (internal/charging/charging.go), and
	// every change to a charge after its creation (a refund, a capture, a
	// void, an expiry) holds its account's lock. No row comes back when the
	// merchant has no such charge.
	lockChargeAccountSQL = `
SELECT a.id FROM accounts a
WHERE a.merchant_id = $1 AND a.id = (SELECT c.account_id FROM charges c WHERE c.merchant_id = $1 AND c.id = $2)
FOR UPDATE OF a`

	// lockChargeSQL reads the charge, locked, in a statement of its own after
	// lockChargeAccountSQL: its snapshot and its clock (statement_timestamp,
	// in chargeColumns) come after the account's lock was taken, so it sees
	// every change made under that lock, and no batch that spent an expired
	// hold's funds (chargesql.go's accountHoldsSQL) can see that hold expire
	// later than this does.
	lockChargeSQL = `SELECT ` + chargeColumns + ` FROM charges WHERE merchant_id = $1 AND id = $2 FOR UPDATE`

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

	// settleHoldSQL ends an authorization's hold: the charge's new status and
	// captured amount ($3, $4), the balance debited by the captured amount
	// and the hold ($5, the authorized amount) released.
	settleHoldSQL = `
WITH charge AS (
    UPDATE charges SET status = $3, amount_captured = $4
    WHERE merchant_id = $1 AND id = $2
)
UPDATE accounts SET balance = balance - $4, held = held - $5
WHERE merchant_id = $1 AND id = $6`
)

// errCardCharge is lockCharge's refusal of a card charge, which has no
// account here: its callers refuse it with a *payment.ChargeStateError.
var errCardCharge = errors.New("a card charge")

// lockCharge locks the merchant's charge and its account (in that order:
// account first) and returns the charge as stored and the clock to decide it
// by, or payment.ErrNotFound. A card charge, which has no account, is
// returned unlocked with errCardCharge.
func (l *ledger) lockCharge(ctx context.Context, merchantID, chargeID uuid.UUID) (payment.Charge, time.Time, error) {
	var accountID uuid.UUID
	err := l.q.QueryRow(ctx, lockChargeAccountSQL, merchantID, chargeID).Scan(&accountID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		c, at, err := scanStoredCharge(l.q.QueryRow(ctx, chargeByIDSQL, merchantID, chargeID))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return payment.Charge{}, time.Time{}, payment.ErrNotFound
		case err != nil:
			return payment.Charge{}, time.Time{}, fmt.Errorf("read charge: %w", err)
		case c.IsCard():
			return c, at, errCardCharge
		}
		return payment.Charge{}, time.Time{}, payment.ErrNotFound
	case err != nil:
		return payment.Charge{}, time.Time{}, fmt.Errorf("lock account of charge: %w", err)
	}
	c, at, err := scanStoredCharge(l.q.QueryRow(ctx, lockChargeSQL, merchantID, chargeID))
	if err != nil {
		return payment.Charge{}, time.Time{}, fmt.Errorf("lock charge: %w", err)
	}
	return c, at, nil
}

func (l *ledger) Refund(ctx context.Context, merchantID, chargeID uuid.UUID, amount *int64) (payment.Refund, error) {
	c, at, err := l.lockCharge(ctx, merchantID, chargeID)
	switch {
	case errors.Is(err, errCardCharge):
		return payment.Refund{}, &payment.ChargeStateError{Op: payment.ErrChargeNotRefundable, Charge: c}
	case err != nil:
		return payment.Refund{}, err
	case c.At(at).Status != payment.ChargeSucceeded:
		return payment.Refund{}, payment.ErrChargeNotRefundable
	}
	r := payment.Refund{ID: payment.NewID(), ChargeID: chargeID, AccountID: c.AccountID, Currency: c.Currency,
		Amount: c.AmountCaptured - c.AmountRefunded}
	if amount != nil {
		r.Amount = *amount
	}
	if r.Amount <= 0 || c.AmountRefunded+r.Amount > c.AmountCaptured {
		return payment.Refund{}, payment.ErrRefundExceedsCharge
	}
	err = l.q.QueryRow(ctx, refundSQL, merchantID, chargeID, r.Amount, r.AccountID, r.ID, r.Currency).Scan(&r.CreatedAt)
	if err != nil {
		return payment.Refund{}, fmt.Errorf("insert refund: %w", err)
	}
	return r, l.event(ctx, merchantID, "refund", r.ID, payment.EventRefundCreated, r)
}

func (l *ledger) Capture(ctx context.Context, merchantID, chargeID uuid.UUID, amount *int64) (payment.Charge, error) {
	return l.settle(ctx, merchantID, chargeID, payment.EventChargeCaptured, payment.ErrChargeNotCapturable, func(c payment.Charge, at time.Time) (payment.Charge, error) {
		return payment.CaptureCharge(c, amount, at)
	})
}

func (l *ledger) Void(ctx context.Context, merchantID, chargeID uuid.UUID) (payment.Charge, error) {
	return l.settle(ctx, merchantID, chargeID, payment.EventChargeVoided, payment.ErrChargeNotVoidable, payment.VoidCharge)
}

// CreateWebhookEndpoint records the endpoint on the key's transaction, with
// the SQL the Webhooks role runs (webhooks.go): the merchant's row lock,
// held to the commit, bounds the live endpoints however many keys race.
func (l *ledger) CreateWebhookEndpoint(ctx context.Context, merchantID uuid.UUID, url string, events []string, secret string) (payment.WebhookEndpoint, error) {
	return createEndpoint(ctx, l.q, merchantID, url, events, secret)
}

// UpdateWebhookEndpoint changes the endpoint on the key's transaction
// (webhooks.go, updateEndpoint).
func (l *ledger) UpdateWebhookEndpoint(ctx context.Context, merchantID, endpointID uuid.UUID, u payment.WebhookEndpointUpdate) (payment.WebhookEndpoint, error) {
	return updateEndpoint(ctx, l.q, merchantID, endpointID, u)
}

// ResendWebhookEvent schedules the event to the endpoint again on the key's
// transaction (webhooks.go, resendEvent).
func (l *ledger) ResendWebhookEvent(ctx context.Context, merchantID, endpointID, eventID uuid.UUID) (payment.ScheduledDelivery, error) {
	return resendEvent(ctx, l.q, merchantID, endpointID, eventID)
}

// settle ends an authorization's hold as decide says (a capture or a void),
// with its event. A card charge is refused as op (ErrChargeNotCapturable,
// ErrChargeNotVoidable): its captures and voids are the processor's.
func (l *ledger) settle(ctx context.Context, merchantID, chargeID uuid.UUID, eventType string, op error,
	decide func(payment.Charge, time.Time) (payment.Charge, error)) (payment.Charge, error) {
	c, at, err := l.lockCharge(ctx, merchantID, chargeID)
	switch {
	case errors.Is(err, errCardCharge):
		return payment.Charge{}, &payment.ChargeStateError{Op: op, Charge: c}
	case err != nil:
		return payment.Charge{}, err
	}
	if c, err = decide(c, at); err != nil {
		return payment.Charge{}, err
	}
	if _, err := l.q.Exec(ctx, settleHoldSQL, merchantID, chargeID, c.Status, c.AmountCaptured, c.Amount, c.AccountID); err != nil {
		return payment.Charge{}, fmt.Errorf("settle hold: %w", err)
	}
	return c, l.event(ctx, merchantID, "charge", c.ID, eventType, c)
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
