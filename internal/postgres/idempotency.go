package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/idempotency"
)

// maxAttempts bounds how often a transaction that hit a deadlock or a
// serialization failure is run again.
const maxAttempts = 3

const (
	// claimKeySQL takes the key's advisory lock (see internal/charging/charging.go: whoever
	// writes a key's row holds it), waiting up to lock_timeout for a twin in
	// flight, then claims the key through its unique index.
	claimKeySQL = `
WITH lock AS (SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0)))
INSERT INTO idempotency_keys (merchant_id, key, fingerprint)
SELECT $1::uuid, $2, $3 FROM lock
ON CONFLICT (merchant_id, key) DO NOTHING
RETURNING true`

	lookupKeySQL = `
SELECT fingerprint, status, coalesce(location, ''), body, body_encoding, created_at, created_at < now() - $3::interval
FROM idempotency_keys
WHERE merchant_id = $1 AND key = $2`

	deleteExpiredKeySQL = `
DELETE FROM idempotency_keys
WHERE merchant_id = $1 AND key = $2 AND created_at < now() - $3::interval`

	// storeResponseSQL stores the response and starts the key's retention:
	// counted from the claim, a request slower than the retention would
	// commit a key already expired, and its retry would execute again.
	storeResponseSQL = `
UPDATE idempotency_keys
SET status = $3, location = nullif($4, ''), body = $5, body_encoding = $6, created_at = clock_timestamp()
WHERE merchant_id = $1 AND key = $2
RETURNING created_at`
)

// Idempotent executes step at most once per (merchant, key). In one
// transaction it claims the key (its advisory lock, then the unique index),
// runs step, and stores step's response; if anything fails, all of it rolls
// back and a retry starts clean.
//
// When the key is already stored, step does not run: the stored response is
// returned as a replay, or idempotency.ErrKeyReused when req's fingerprint
// differs. When another transaction holds the key, Idempotent waits for it up to
// KeyWait and then answers from its outcome, or returns idempotency.ErrKeyInUse.
// Database outages are reported as payment.ErrUnavailable.
func (s *Keys) Idempotent(ctx context.Context, req idempotency.Request, step idempotency.Step) (idempotency.Result, error) {
	for attempt := 1; ; attempt++ {
		res, err := s.idempotentOnce(ctx, req, step)
		if err != nil && retryable(err) && attempt < maxAttempts {
			continue
		}
		return res, asUnavailable(err)
	}
}

func (s *Keys) idempotentOnce(ctx context.Context, req idempotency.Request, step idempotency.Step) (idempotency.Result, error) {
	var (
		res    idempotency.Result
		events int
	)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		// Twice at most: a key found expired is deleted and claimed afresh.
		for range 2 {
			claimed, err := claimKey(ctx, tx, req)
			if err != nil {
				return err
			}
			if claimed {
				res, events, err = runStep(ctx, tx, req, step)
				return err
			}
			var found bool
			if res, found, err = s.replay(ctx, tx, req); found || err != nil {
				return err
			}
		}
		return errors.New("idempotency key vanished twice while being claimed")
	})
	if err == nil && events > 0 {
		s.eventsCommitted()
	}
	return res, err
}

// runStep runs step for a freshly claimed key and stores its response, which
// starts the key's retention (Result.StoredAt). It reports how many events step
// wrote.
func runStep(ctx context.Context, tx pgx.Tx, req idempotency.Request, step idempotency.Step) (idempotency.Result, int, error) {
	l := &ledger{q: tx}
	resp, err := step(ctx, l)
	if err != nil {
		return idempotency.Result{}, 0, err
	}
	body, encoding := encodeBody(resp.Body)
	var storedAt time.Time
	if err := tx.QueryRow(ctx, storeResponseSQL, req.MerchantID, req.Key, resp.Status, resp.Location, body, encoding).Scan(&storedAt); err != nil {
		return idempotency.Result{}, 0, fmt.Errorf("store response: %w", err)
	}
	return idempotency.Result{Response: resp, StoredAt: storedAt}, l.events, nil
}

// replay answers req from the response stored under its key. It reports
// found=false when there is none to answer from: the janitor removed the row
// after the claim saw it, or it has expired (and is now deleted), so the
// caller claims the key afresh.
func (s *Keys) replay(ctx context.Context, tx pgx.Tx, req idempotency.Request) (res idempotency.Result, found bool, err error) {
	var (
		stored   []byte
		resp     idempotency.Response
		status   *int32
		encoding *string
		storedAt time.Time
		expired  bool
	)
	err = tx.QueryRow(ctx, lookupKeySQL, req.MerchantID, req.Key, s.opts.KeyTTL).
		Scan(&stored, &status, &resp.Location, &resp.Body, &encoding, &storedAt, &expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idempotency.Result{}, false, nil
	case err != nil:
		return idempotency.Result{}, false, fmt.Errorf("look up key: %w", err)
	case expired:
		if _, err := tx.Exec(ctx, deleteExpiredKeySQL, req.MerchantID, req.Key, s.opts.KeyTTL); err != nil {
			return idempotency.Result{}, false, fmt.Errorf("delete expired key: %w", err)
		}
		if s.opts.OnExpired != nil {
			s.opts.OnExpired()
		}
		return idempotency.Result{}, false, nil
	case status == nil || len(stored) != len(req.Fingerprint):
		// Cannot happen: the row and its response commit together.
		return idempotency.Result{}, false, errors.New("stored idempotency key has no response")
	}
	resp.Status = int(*status)
	if resp.Body, err = decodeBody(resp.Body, encoding); err != nil {
		return idempotency.Result{}, false, err
	}
	// The stored response is answered only once the standby has it (durable.go).
	if _, err := tx.Exec(ctx, confirmSQL); err != nil {
		return idempotency.Result{}, false, fmt.Errorf("confirm stored key: %w", err)
	}
	res, err = idempotency.Replay(req, idempotency.Fingerprint(stored), resp)
	res.StoredAt = storedAt
	return res, true, err
}

// claimKey inserts the key row. If a committed row exists it reports false;
// if an uncommitted one exists, PostgreSQL makes the insert wait for that
// transaction (bounded by lock_timeout) and then decides.
func claimKey(ctx context.Context, tx pgx.Tx, req idempotency.Request) (bool, error) {
	var claimed bool
	err := tx.QueryRow(ctx, claimKeySQL, req.MerchantID, req.Key, req.Fingerprint[:]).Scan(&claimed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case hasCode(err, codeLockNotAvailable):
		return false, idempotency.ErrKeyInUse
	case err != nil:
		return false, fmt.Errorf("claim key: %w", err)
	}
	return true, nil
}

// janitorLockKey is the advisory lock that lets one janitor run at a time.
const janitorLockKey = 0x7061796d_6a616e69 // "paymjani"

// deleteExpiredKeysSQL deletes the oldest expired keys, a bounded batch at a
// time, walking the created_at index.
const deleteExpiredKeysSQL = `
DELETE FROM idempotency_keys
WHERE (merchant_id, key) IN (
    SELECT merchant_id, key FROM idempotency_keys
    WHERE created_at < now() - $1::interval
    ORDER BY created_at
    LIMIT $2
)`

// DeleteExpiredKeys deletes up to batch keys older than ttl, in one short
// transaction. It reports ran=false without deleting anything when another
// janitor holds the lock.
func (s *Keys) DeleteExpiredKeys(ctx context.Context, ttl time.Duration, batch int) (deleted int64, ran bool, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(janitorLockKey)).Scan(&ran); err != nil || !ran {
			return err
		}
		tag, err := tx.Exec(ctx, deleteExpiredKeysSQL, ttl, batch)
		deleted = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, false, asUnavailable(fmt.Errorf("delete expired keys: %w", err))
	}
	return deleted, ran, nil
}
