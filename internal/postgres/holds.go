package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/payments/internal/payment"
)

// Holds records the expiry of authorizations: the sweep behind the rule that
// an authorization past its expires_at holds nothing. Reads apply that rule
// themselves (reader.go, chargesql.go), so the sweep only writes down what
// every reader already sees: the 'expired' state, the hold taken out of the
// account's held, and the charge.expired event.
type Holds struct{ *db }

// NewHolds builds the Holds role on d.
func NewHolds(d *DB) *Holds { return &Holds{d.db} }

// expiryLockKey is the advisory lock that lets one sweep run at a time.
const expiryLockKey = 0x7061796d_65787069 // "paymexpi"

const (
	// lockExpiredSQL picks the $1 oldest expired holds and locks their
	// accounts, in the order every transaction locks accounts; it returns
	// those holds. The sweep is bounded by holds, not accounts: one
	// account's many holds take many sweeps, each a short transaction,
	// never one that holds back every merchant's events (the horizon).
	lockExpiredSQL = `
WITH due AS MATERIALIZED (
    SELECT c.merchant_id, c.account_id, c.id FROM charges c
    WHERE c.status = 'authorized' AND c.expires_at <= now()
    ORDER BY c.expires_at LIMIT $1
), locked AS (
    SELECT a.merchant_id, a.id FROM accounts a
    WHERE (a.merchant_id, a.id) IN (SELECT merchant_id, account_id FROM due)
    ORDER BY a.merchant_id, a.id
    FOR UPDATE OF a
)
SELECT d.merchant_id, d.id FROM due d
WHERE (d.merchant_id, d.account_id) IN (SELECT merchant_id, id FROM locked)`

	// expireSQL, a statement of its own after lockExpiredSQL (so its
	// snapshot and clock come after those locks), writes the expiry of
	// those holds that are still authorized and past their expiry, and
	// releases them from their accounts.
	expireSQL = `
WITH expired AS (
    UPDATE charges c SET status = 'expired'
    WHERE (c.merchant_id, c.id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
      AND c.status = 'authorized' AND c.expires_at <= statement_timestamp()
    RETURNING c.merchant_id, ` + chargeColumns + `
), released AS (
    UPDATE accounts a SET held = a.held - e.total
    FROM (SELECT merchant_id, account_id, sum(amount) AS total FROM expired GROUP BY 1, 2) e
    WHERE a.merchant_id = e.merchant_id AND a.id = e.account_id
)
SELECT * FROM expired ORDER BY expires_at, id`

	insertEventsSQL = `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
SELECT m, id, 'charge', aggregate, $4, payload
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $5::jsonb[]) WITH ORDINALITY AS e(m, id, aggregate, payload, i)
ORDER BY i`
)

// ExpireHolds records the expiry of the batch oldest expired holds at most,
// in one transaction, with their charge.expired events. It reports ran=false without doing anything
// when another sweep holds the lock.
func (s *Holds) ExpireHolds(ctx context.Context, batch int) (expired int64, ran bool, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(expiryLockKey)).Scan(&ran); err != nil || !ran {
			return err
		}
		rows, _ := tx.Query(ctx, lockExpiredSQL, batch)
		var merchants, charges []pgtype.UUID
		for rows.Next() {
			var m, c pgtype.UUID
			if err := rows.Scan(&m, &c); err != nil {
				rows.Close()
				return err
			}
			merchants, charges = append(merchants, m), append(charges, c)
		}
		if rows.Close(); rows.Err() != nil || len(charges) == 0 {
			return rows.Err()
		}
		n, err := expireLocked(ctx, tx, merchants, charges)
		expired = n
		return err
	})
	if err != nil {
		return 0, false, asUnavailable(fmt.Errorf("expire holds: %w", err))
	}
	if expired > 0 {
		s.eventsCommitted()
	}
	return expired, ran, nil
}

// expireLocked writes the expiry of the holds charges names, whose accounts
// are locked, and their events, each with the charge as it now stands.
func expireLocked(ctx context.Context, tx pgx.Tx, merchants, charges []pgtype.UUID) (int64, error) {
	rows, _ := tx.Query(ctx, expireSQL, merchants, charges)
	var eventMerchants, eventIDs, chargeIDs []pgtype.UUID
	var payloads [][]byte
	for rows.Next() {
		var (
			m  pgtype.UUID
			c  payment.Charge
			at time.Time
		)
		if err := rows.Scan(append([]any{&m}, chargeDest(&c, &at)...)...); err != nil {
			rows.Close()
			return 0, err
		}
		payload, err := json.Marshal(c)
		if err != nil {
			rows.Close()
			return 0, err
		}
		eventMerchants, eventIDs, chargeIDs = append(eventMerchants, m), append(eventIDs, pgUUID(payment.NewID())), append(chargeIDs, pgUUID(c.ID))
		payloads = append(payloads, payload)
	}
	if rows.Close(); rows.Err() != nil {
		return 0, rows.Err()
	}
	if len(eventIDs) == 0 {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, insertEventsSQL, eventMerchants, eventIDs, chargeIDs, payment.EventChargeExpired, payloads); err != nil {
		return 0, fmt.Errorf("insert charge.expired events: %w", err)
	}
	return int64(len(eventIDs)), nil
}
