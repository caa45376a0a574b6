package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/payments/internal/payment"
)

const (
	// accountSQL reads an account with its live holds: authorizations not
	// captured, voided or past expires_at, whether or not the expiry sweep
	// has yet recorded them (payment/authorize.go). held, which counts the
	// unswept ones too, saves the sum for an account that never held any.
	accountSQL = `
SELECT a.id, a.merchant_id, a.currency, a.balance,
       CASE WHEN a.held = 0 THEN 0 ELSE (
           SELECT coalesce(sum(c.amount), 0)::bigint FROM charges c
           WHERE c.merchant_id = a.merchant_id AND c.account_id = a.id
             AND c.status = 'authorized' AND c.expires_at > statement_timestamp()) END,
       a.description, a.metadata, a.created_at
FROM accounts a WHERE a.merchant_id = $1 AND a.id = $2`

	depositByIDSQL = `
SELECT id, account_id, amount, currency, created_at
FROM deposits WHERE merchant_id = $1 AND account_id = $2 AND id = $3`

	chargeByIDSQL = `SELECT ` + chargeColumns + ` FROM charges WHERE merchant_id = $1 AND id = $2`
)

// Account returns the merchant's account with its current balance, or
// payment.ErrNotFound.
func (s *Reader) Account(ctx context.Context, merchantID, id uuid.UUID) (a payment.Account, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error { return scanAccount(row, &a) }, accountSQL, merchantID, id)
	return a, err
}

// account is Account in a read of more statements.
func account(ctx context.Context, q querier, merchantID, id uuid.UUID) (payment.Account, error) {
	var a payment.Account
	return a, scanAccount(q.QueryRow(ctx, accountSQL, merchantID, id), &a)
}

func scanAccount(row pgx.Row, a *payment.Account) error {
	return readErr("account", row.Scan(&a.ID, &a.MerchantID, &a.Currency, &a.Balance, &a.Held, &a.Description, &a.Metadata, &a.CreatedAt))
}

// Deposit returns a deposit into the merchant's account, or payment.ErrNotFound.
func (s *Reader) Deposit(ctx context.Context, merchantID, accountID, id uuid.UUID) (d payment.Deposit, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error {
		return readErr("deposit", row.Scan(&d.ID, &d.AccountID, &d.Amount, &d.Currency, &d.CreatedAt))
	}, depositByIDSQL, merchantID, accountID, id)
	return d, err
}

// Charge returns the merchant's charge, or payment.ErrNotFound.
func (s *Reader) Charge(ctx context.Context, merchantID, id uuid.UUID) (c payment.Charge, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error {
		c, err = scanCharge(row)
		return readErr("charge", err)
	}, chargeByIDSQL, merchantID, id)
	return c, err
}

// scanCharge reads a row of chargeColumns: the charge as it stands when the
// statement ran (an authorization past its expires_at is expired, whether or
// not the sweep has yet recorded it).
func scanCharge(row pgx.Row) (payment.Charge, error) {
	c, at, err := scanStoredCharge(row)
	return c.At(at), err
}

// scanStoredCharge reads a row of chargeColumns: the charge as stored, and
// the statement's clock.
func scanStoredCharge(row pgx.Row) (c payment.Charge, at time.Time, err error) {
	err = row.Scan(chargeDest(&c, &at)...)
	return c, at, err
}

// chargeDest is where a row of chargeColumns goes.
func chargeDest(c *payment.Charge, at *time.Time) []any {
	return []any{&c.ID, &c.AccountID, &c.PaymentMethod, &c.Amount, &c.Currency, &c.Status, &c.FailureCode, &c.DeclineCode,
		&c.AmountCaptured, &c.AmountRefunded, &c.ExpiresAt, &c.Description, &c.Metadata, &c.CreatedAt, at}
}

// refundDest are the scan destinations of refundColumns.
func refundDest(r *payment.Refund) []any {
	return []any{&r.ID, &r.ChargeID, &r.AccountID, &r.Amount, &r.Currency, &r.Status, &r.CreatedAt}
}

func readErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return payment.ErrNotFound
	default:
		return asUnavailable(fmt.Errorf("select %s: %w", what, err))
	}
}

const (
	// A card charge has no account (uuid.Nil) and a payment method; an
	// account's charge has no payment method ("").
	chargeColumns = `id, coalesce(account_id, '00000000-0000-0000-0000-000000000000'::uuid) AS account_id,
       coalesce(payment_method, '') AS payment_method, amount, currency, status, coalesce(failure_code, ''),
       coalesce(decline_code, '') AS decline_code, amount_captured, amount_refunded,
       expires_at, description, metadata, created_at, statement_timestamp()`

	chargeSeqSQL = `SELECT seq FROM charges WHERE merchant_id = $1 AND id = $2`

	// Charges are paged by seq, newest first. A page starts below the previous
	// page's last seq, so a charge created meanwhile never shifts the pages.
	chargesSQL = `
SELECT ` + chargeColumns + `
FROM charges WHERE merchant_id = $1 AND seq < $2
ORDER BY seq DESC LIMIT $3`

	accountChargesSQL = `
SELECT ` + chargeColumns + `
FROM charges WHERE merchant_id = $1 AND seq < $2 AND account_id = $4
ORDER BY seq DESC LIMIT $3`

	// refundColumns are a refund's, for refundDest: a card charge's refund
	// has no account, and a status; an account's has no status ('').
	refundColumns = `id, charge_id, coalesce(account_id, '00000000-0000-0000-0000-000000000000'::uuid),
       amount, currency, CASE WHEN account_id IS NULL THEN status ELSE '' END, created_at`

	refundByIDSQL = `
SELECT ` + refundColumns + `
FROM refunds WHERE merchant_id = $1 AND charge_id = $2 AND id = $3`

	eventPositionSQL = `SELECT tx_id, seq FROM events WHERE merchant_id = $1 AND id = $2`

	// Events are paged by (tx_id, seq), and only among events below the event
	// horizon ($5, horizon.go), read by the statement before this one: that
	// prefix never gains a row, so pages never skip one (see migration 0002).
	eventsSQL = `
SELECT id, type, payload, created_at
FROM events
WHERE merchant_id = $1
  AND tx_id < $5::xid8
  AND (tx_id, seq) > ($2::xid8, $3::bigint)
ORDER BY tx_id, seq
LIMIT $4`

	// An event is read as the feed lists it: only below the event horizon
	// ($3), read by the statement before this one, so that it is never
	// shown before the feed would show it, nor behind a cursor.
	eventByIDSQL = `
SELECT id, type, payload, created_at
FROM events
WHERE merchant_id = $1 AND id = $2 AND tx_id < $3::xid8`
)

// Charges returns a page of the merchant's charges, newest first, or
// payment.ErrNotFound when q names an account the merchant does not have.
func (s *Reader) Charges(ctx context.Context, merchantID uuid.UUID, q payment.ChargeQuery) (p payment.Page[payment.Charge], err error) {
	err = s.read(ctx, func(db querier) error {
		p, err = charges(ctx, db, merchantID, q)
		return err
	})
	return p, err
}

func charges(ctx context.Context, db querier, merchantID uuid.UUID, q payment.ChargeQuery) (payment.Page[payment.Charge], error) {
	after := int64(math.MaxInt64)
	if q.StartingAfter != nil {
		err := db.QueryRow(ctx, chargeSeqSQL, merchantID, *q.StartingAfter).Scan(&after)
		if errors.Is(err, pgx.ErrNoRows) {
			return payment.Page[payment.Charge]{}, payment.Invalid("starting_after", "names no charge of yours")
		}
		if err != nil {
			return payment.Page[payment.Charge]{}, asUnavailable(fmt.Errorf("select cursor charge: %w", err))
		}
	}
	sql, args := chargesSQL, []any{merchantID, after, q.Limit + 1}
	if q.AccountID != nil {
		// Filtering by another merchant's (or no) account is a 404, like
		// reading it would be, not an empty page.
		if _, err := account(ctx, db, merchantID, *q.AccountID); err != nil {
			return payment.Page[payment.Charge]{}, err
		}
		sql, args = accountChargesSQL, append(args, *q.AccountID)
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return payment.Page[payment.Charge]{}, asUnavailable(fmt.Errorf("select charges: %w", err))
	}
	charges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.Charge, error) { return scanCharge(row) })
	if err != nil {
		return payment.Page[payment.Charge]{}, asUnavailable(fmt.Errorf("select charges: %w", err))
	}
	return page(charges, q.Limit), nil
}

// Refund returns a refund of the merchant's charge, or payment.ErrNotFound.
func (s *Reader) Refund(ctx context.Context, merchantID, chargeID, id uuid.UUID) (r payment.Refund, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error {
		return readErr("refund", row.Scan(refundDest(&r)...))
	}, refundByIDSQL, merchantID, chargeID, id)
	return r, err
}

// Events returns a page of the merchant's events, oldest first. No event is
// listed that a failover could still lose (confirmed.go).
func (s *Reader) Events(ctx context.Context, merchantID uuid.UUID, q payment.EventQuery) (p payment.Page[payment.Event], err error) {
	err = s.read(ctx, func(db querier) error {
		p, err = events(ctx, db, merchantID, q)
		return err
	})
	return p, err
}

func events(ctx context.Context, db querier, merchantID uuid.UUID, q payment.EventQuery) (payment.Page[payment.Event], error) {
	var (
		afterTx  pgtype.Uint64 // xid8
		afterSeq int64
	)
	afterTx.Valid = true
	if q.StartingAfter != nil {
		err := db.QueryRow(ctx, eventPositionSQL, merchantID, *q.StartingAfter).Scan(&afterTx, &afterSeq)
		if errors.Is(err, pgx.ErrNoRows) {
			return payment.Page[payment.Event]{}, payment.Invalid("starting_after", "names no event of yours")
		}
		if err != nil {
			return payment.Page[payment.Event]{}, asUnavailable(fmt.Errorf("select cursor event: %w", err))
		}
	}
	h, err := eventHorizon(ctx, db)
	if err != nil {
		return payment.Page[payment.Event]{}, err
	}
	rows, err := db.Query(ctx, eventsSQL, merchantID, afterTx, afterSeq, q.Limit+1, h.xid)
	if err != nil {
		return payment.Page[payment.Event]{}, asUnavailable(fmt.Errorf("select events: %w", err))
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.Event, error) {
		var e payment.Event
		err := row.Scan(&e.ID, &e.Type, &e.Data, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return payment.Page[payment.Event]{}, asUnavailable(fmt.Errorf("select events: %w", err))
	}
	return page(events, q.Limit), nil
}

// Event returns the merchant's event as Events lists it, or
// payment.ErrNotFound when Events would not list it: another merchant's, one
// held back by the event horizon, or one pruned. Like Events, it shows no
// event that a failover could still lose (confirmed.go).
func (s *Reader) Event(ctx context.Context, merchantID, id uuid.UUID) (e payment.Event, err error) {
	err = s.read(ctx, func(db querier) error {
		h, err := eventHorizon(ctx, db)
		if err != nil {
			return err
		}
		return readErr("event", db.QueryRow(ctx, eventByIDSQL, merchantID, id, h.xid).Scan(&e.ID, &e.Type, &e.Data, &e.CreatedAt))
	})
	return e, err
}

// page cuts the limit+1 rows a list query fetched to limit, noting whether
// there were more.
func page[T any](items []T, limit int) payment.Page[T] {
	if len(items) > limit {
		return payment.Page[T]{Items: items[:limit], HasMore: true}
	}
	return payment.Page[T]{Items: items}
}
