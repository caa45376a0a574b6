package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"payments/internal/idempotency"
	"payments/internal/payment"
)

// Operation is the business step guarded by an idempotency key. It runs in the
// transaction that claimed the key and returns the response to store. A business
// refusal that must be replayed is a Response (for example a 402), not an error;
// an error rolls everything back, key included.
type Operation func(ctx context.Context, l payment.Ledger) (idempotency.Response, error)

// maxAttempts bounds how often a transaction that hit a deadlock or a
// serialization failure is run again.
const maxAttempts = 3

const (
	claimKeySQL = `
INSERT INTO idempotency_keys (merchant_id, key, fingerprint)
VALUES ($1, $2, $3)
ON CONFLICT (merchant_id, key) DO NOTHING`

	lookupKeySQL = `
SELECT fingerprint, status, coalesce(location, ''), body, created_at < now() - $3::interval
FROM idempotency_keys
WHERE merchant_id = $1 AND key = $2`

	deleteExpiredKeySQL = `
DELETE FROM idempotency_keys
WHERE merchant_id = $1 AND key = $2 AND created_at < now() - $3::interval`

	storeResponseSQL = `
UPDATE idempotency_keys
SET status = $3, location = nullif($4, ''), body = $5
WHERE merchant_id = $1 AND key = $2`
)

// Idempotent executes op at most once per (merchant, key). In one transaction it
// claims the key through the unique index, runs op, and stores op's response;
// if any step fails, all of it rolls back and a retry starts clean.
//
// When the key is already stored, op does not run: the stored response is
// returned as a replay, or idempotency.ErrKeyReused when req's fingerprint
// differs. When another transaction holds the key, Idempotent waits for it up to
// KeyWait and then answers from its outcome, or returns idempotency.ErrKeyInUse.
// Database outages are reported as payment.ErrUnavailable.
func (s *Store) Idempotent(ctx context.Context, req idempotency.Request, op Operation) (idempotency.Result, error) {
	for attempt := 1; ; attempt++ {
		res, err := s.idempotentOnce(ctx, req, op)
		if err != nil && retryable(err) && attempt < maxAttempts {
			continue
		}
		return res, interpret(err)
	}
}

func (s *Store) idempotentOnce(ctx context.Context, req idempotency.Request, op Operation) (idempotency.Result, error) {
	var res idempotency.Result
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		// Twice at most: a key found expired is deleted and claimed afresh.
		for range 2 {
			claimed, err := claimKey(ctx, tx, req)
			if err != nil {
				return err
			}
			if claimed {
				resp, err := op(ctx, ledger{tx})
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, storeResponseSQL, req.MerchantID, req.Key, resp.Status, resp.Location, resp.Body); err != nil {
					return fmt.Errorf("store response: %w", err)
				}
				res = idempotency.Result{Response: resp}
				return nil
			}

			var (
				stored  []byte
				resp    idempotency.Response
				status  *int32
				expired bool
			)
			err = tx.QueryRow(ctx, lookupKeySQL, req.MerchantID, req.Key, s.opts.KeyTTL).
				Scan(&stored, &status, &resp.Location, &resp.Body, &expired)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				continue // the janitor removed it between our two statements
			case err != nil:
				return fmt.Errorf("look up key: %w", err)
			case expired:
				if _, err := tx.Exec(ctx, deleteExpiredKeySQL, req.MerchantID, req.Key, s.opts.KeyTTL); err != nil {
					return fmt.Errorf("delete expired key: %w", err)
				}
				continue
			case status == nil || len(stored) != len(req.Fingerprint):
				// Cannot happen: the row and its response commit together.
				return errors.New("stored idempotency key has no response")
			}
			resp.Status = int(*status)
			res, err = idempotency.Replay(req, idempotency.Fingerprint(stored), resp)
			return err
		}
		return errors.New("idempotency key vanished twice while being claimed")
	})
	return res, err
}

// claimKey inserts the key row. If a committed row exists it reports false; if
// an uncommitted one exists, PostgreSQL makes the insert wait for that
// transaction (bounded by lock_timeout) and then decides.
func claimKey(ctx context.Context, tx pgx.Tx, req idempotency.Request) (bool, error) {
	tag, err := tx.Exec(ctx, claimKeySQL, req.MerchantID, req.Key, req.Fingerprint[:])
	if hasCode(err, codeLockNotAvailable) {
		return false, idempotency.ErrKeyInUse
	}
	if err != nil {
		return false, fmt.Errorf("claim key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}
