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
	// lockExpiredSQL locks the accounts of the oldest expired holds, at most
	// $1 holds' worth, in the order every transaction locks accounts.
	lockExpiredSQL = `
SELECT a.merchant_id, a.id FROM accounts a
WHERE (a.merchant_id, a.id) IN (
    SELECT c.merchant_id, c.account_id FROM charges c
    WHERE c.status = 'authorized' AND c.expires_at <= now()
    ORDER BY c.expires_at LIMIT $1)
ORDER BY a.merchant_id, a.id
FOR UPDATE OF a`

	// expireSQL, a statement of its own after lockExpiredSQL (so its
	// snapshot and clock come after those locks), writes the expiry of
	// every expired hold of those accounts and releases their holds.
	expireSQL = `
WITH expired AS (
    UPDATE charges c SET status = 'expired'
    WHERE (c.merchant_id, c.account_id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
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

// ExpireHolds records the expiry of up to about batch expired holds (all
// those of the accounts of the batch oldest), in one transaction, with
// their charge.expired events. It reports ran=false without doing anything
// when another sweep holds the lock.
func (s *Holds) ExpireHolds(ctx context.Context, batch int) (expired int64, ran bool, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(expiryLockKey)).Scan(&ran); err != nil || !ran {
			return err
		}
		rows, _ := tx.Query(ctx, lockExpiredSQL, batch)
		var merchants, accounts []pgtype.UUID
		for rows.Next() {
			var m, a pgtype.UUID
			if err := rows.Scan(&m, &a); err != nil {
				rows.Close()
				return err
			}
			merchants, accounts = append(merchants, m), append(accounts, a)
		}
		if rows.Close(); rows.Err() != nil || len(accounts) == 0 {
			return rows.Err()
		}
		n, err := expireLocked(ctx, tx, merchants, accounts)
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

// expireLocked writes the expiry of the expired holds of the locked accounts,
// and their events, each with the charge as it now stands.
func expireLocked(ctx context.Context, tx pgx.Tx, merchants, accounts []pgtype.UUID) (int64, error) {
	rows, _ := tx.Query(ctx, expireSQL, merchants, accounts)
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
