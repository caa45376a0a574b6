package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"payments/internal/idempotency"
	"payments/internal/payment"
)

// chargeSQL is the hot path of the service: one statement, run as its own
// transaction, that debits the account if it covers the amount, claims the key
// with the success response already in place, records the charge and writes
// its event. It commits only when all of that happened:
//
//   - The account does not cover the amount (or does not exist, or holds
//     another currency): nothing is debited, so nothing is claimed, and the
//     statement changes nothing.
//   - The key is already stored: the claim inserts nothing after the debit, and
//     the division by the number of claimed rows (zero) aborts the statement,
//     debit included.
//   - The key is held by a transaction in flight: the claim waits for it, as a
//     lone INSERT would, then inserts or aborts as above.
//
// The debit is re-checked against the newest balance under READ COMMITTED, as
// everywhere else. It reports the key's creation time, or NULL when nothing
// was done.
const chargeSQL = `
WITH debit AS (
    UPDATE accounts SET balance = balance - $8
    WHERE merchant_id = $1 AND id = $7 AND currency = $9 AND balance >= $8
    RETURNING id
), claim AS (
    INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, body_encoding)
    SELECT $1, $2, $3, $4, $5, $6, $15 FROM debit
    ON CONFLICT (merchant_id, key) DO NOTHING
    RETURNING created_at
), charge AS (
    INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, description, metadata, created_at)
    SELECT $1, $10, $7, $8, $9, 'succeeded', $11, $12, $13 FROM claim
    RETURNING id
), event AS (
    INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload, created_at)
    SELECT $1, $14, 'charge', id, 'charge.succeeded', $16::jsonb, $13 FROM charge
)
SELECT CASE WHEN EXISTS (SELECT FROM debit) THEN 1 / (SELECT count(*)::int FROM claim) END,
       (SELECT created_at FROM claim)`

// SQLSTATE of the deliberate abort in chargeSQL.
const codeDivisionByZero = "22012"

// waitedForKey reports a lock timeout while waiting on the idempotency key's
// index entry (PostgreSQL names the relation in the error's context), as
// opposed to one while waiting for the account's row.
func waitedForKey(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeLockNotAvailable &&
		strings.Contains(pgErr.Where, "idempotency_keys")
}

// IdempotentCharge is Idempotent with a fast path for the common case, a new
// charge that succeeds: planned is the charge it creates and success the
// response to store, whose body is planned's JSON (also the event's data).
// The fast path is a single statement in a single round trip, the key claim
// included. Every other case (the account does not cover the charge, the key
// is known, a lock wait timed out) falls back to Idempotent with op, which
// decides exactly as it would have alone.
func (s *Store) IdempotentCharge(ctx context.Context, req idempotency.Request, planned payment.Charge, success idempotency.Response, op Operation) (idempotency.Result, error) {
	res, done, err := s.chargeFast(ctx, req, planned, success)
	if done || err != nil {
		return res, err
	}
	return s.Idempotent(ctx, req, op)
}

// chargeFast runs chargeSQL. It reports done=false, with no error, when the
// statement changed nothing and the general path must decide.
func (s *Store) chargeFast(ctx context.Context, req idempotency.Request, c payment.Charge, success idempotency.Response) (idempotency.Result, bool, error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return idempotency.Result{}, false, err
	}
	defer conn.Release()

	var (
		check     *int32
		claimedAt *time.Time
	)
	body, encoding := encodeBody(success.Body)
	err = conn.QueryRow(ctx, chargeSQL,
		req.MerchantID, req.Key, req.Fingerprint[:], success.Status, success.Location, body,
		c.AccountID, c.Amount, c.Currency, c.ID, c.Description, c.Metadata, c.CreatedAt, payment.NewID(),
		encoding, string(success.Body),
	).Scan(&check, &claimedAt)
	switch {
	case waitedForKey(err):
		// The key's twin is still in flight after the whole wait bound.
		return idempotency.Result{}, false, idempotency.ErrKeyInUse
	case hasCode(err, codeDivisionByZero), hasCode(err, codeLockNotAvailable), retryable(err):
		return idempotency.Result{}, false, nil // rolled back: the general path decides
	case err != nil:
		return idempotency.Result{}, false, interpret(fmt.Errorf("charge: %w", err))
	case claimedAt == nil:
		return idempotency.Result{}, false, nil // not covered: nothing happened
	}
	s.eventsCommitted()
	return idempotency.Result{Response: success, StoredAt: *claimedAt}, true, nil
}
