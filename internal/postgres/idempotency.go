package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// maxAttempts bounds how often a transaction that hit a deadlock or a
// serialization failure is run again (inTxRetried).
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
RETURNING true, now()`

	lookupKeySQL = `
SELECT fingerprint, status, coalesce(location, ''), body, body_encoding, operation_id, created_at,
       status IS NOT NULL AND created_at < now() - $3::interval
FROM idempotency_keys
WHERE merchant_id = $1 AND key = $2`

	deleteExpiredKeySQL = `
DELETE FROM idempotency_keys
WHERE merchant_id = $1 AND key = $2 AND status IS NOT NULL AND created_at < now() - $3::interval`

	// storeResponseSQL stores the response and starts the key's retention:
	// counted from the claim, a request slower than the retention would
	// commit a key already expired, and its retry would execute again.
	storeResponseSQL = `
UPDATE idempotency_keys
SET status = $3, location = nullif($4, ''), body = $5, body_encoding = $6, created_at = clock_timestamp()
WHERE merchant_id = $1 AND key = $2
RETURNING created_at`

	// bindKeySQL binds a claimed key to the operation going on under it.
	// Its retention starts when the operation answers it.
	bindKeySQL = `
UPDATE idempotency_keys SET operation_id = $3
WHERE merchant_id = $1 AND key = $2`
)

// BeginKeyed begins a keyed write's transaction on a pooled connection:
// Keys is the store of keyed writes on the ledger (idempotency.Store), which
// answers the key contract's statements and the ledger's in one
// transaction; the algorithm that runs them is idempotency.Keys.
func (s *Keys) BeginKeyed(ctx context.Context) (idempotency.Tx[payment.Ledger], error) {
	k, err := s.beginKeyTx(ctx)
	if err != nil {
		return nil, err
	}
	t := &ledgerTx{keyTx: k}
	t.l.q = k.q
	return t, nil
}

// ledgerTx is a keyed write whose work is the ledger's (payment.Ledger).
type ledgerTx struct {
	*keyTx
	l ledger
}

func (t *ledgerTx) Work() payment.Ledger { return &t.l }

// Commit commits and, when the ledger wrote events, wakes the relay.
func (t *ledgerTx) Commit(ctx context.Context) error {
	if err := t.keyTx.Commit(ctx); err != nil {
		return err
	}
	if t.l.events > 0 {
		t.db.eventsCommitted()
	}
	return nil
}

// keyTx is a transaction on a pooled connection with the statements on a
// key's row (idempotency.Tx but for Work). Its errors are the key
// contract's: idempotency.ErrConflict for a deadlock or a serialization
// failure, idempotency.ErrKeyInUse for a key lock that stayed held, and
// payment.ErrUnavailable for a database that is not there.
//
// Its round trips are as few as the algorithm allows: its BEGIN goes with
// the claim, its first statement, and the statements whose answer nobody
// reads (a key's binding, an operation's rows; atCommit) go with its COMMIT.
// PostgreSQL runs a pipeline in order and skips the rest of it after a
// statement fails, COMMIT included (pipelined.go): a deferred statement
// that fails fails the commit, and the transaction is rolled back.
type keyTx struct {
	db   *db
	conn *pgxpool.Conn
	// q runs the transaction's statements: the connection, once the claim
	// has begun the transaction, or tx.
	q querier
	// tx is the transaction DB.Begin began (nil for a keyed write, which
	// begins with its claim).
	tx       pgx.Tx
	begun    bool
	deferred []*pgx.QueuedQuery
	// now is the transaction's clock (now()), read by the claim.
	now  time.Time
	done bool
}

func (s *db) beginKeyTx(ctx context.Context) (*keyTx, error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, keyError(err)
	}
	return &keyTx{db: s, conn: conn, q: conn.Conn()}, nil
}

// atCommit queues sql with args to run just before the commit, in its round
// trip.
func (t *keyTx) atCommit(sql string, args ...any) {
	t.deferred = append(t.deferred, &pgx.QueuedQuery{SQL: sql, Arguments: args})
}

// WorkError turns an error of the work's statements into the key
// contract's.
func (t *keyTx) WorkError(err error) error { return keyError(err) }

// keyError turns a driver's error into the key contract's.
func keyError(err error) error {
	if retryable(err) {
		return fmt.Errorf("%w: %w", idempotency.ErrConflict, err)
	}
	return asUnavailable(err)
}

// Claim inserts the key row. If a committed row exists it reports false; if
// an uncommitted one exists, the key's advisory lock makes the insert wait
// for that transaction (bounded by lock_timeout) and then decide.
//
// It begins the transaction, in the same round trip, when nothing has.
func (t *keyTx) Claim(ctx context.Context, req idempotency.Request) (bool, error) {
	var claimed bool
	err := t.claim(ctx, req).Scan(&claimed, &t.now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case hasCode(err, codeLockNotAvailable):
		return false, idempotency.ErrKeyInUse
	case err != nil:
		return false, keyError(fmt.Errorf("claim key: %w", err))
	}
	return true, nil
}

// claim runs claimKeySQL, after BEGIN in one round trip if the transaction
// has not begun.
func (t *keyTx) claim(ctx context.Context, req idempotency.Request) pgx.Row {
	args := []any{req.MerchantID, req.Key, req.Fingerprint[:]}
	if t.begun || t.tx != nil {
		return t.q.QueryRow(ctx, claimKeySQL, args...)
	}
	t.begun = true
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(claimKeySQL, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return errRow{fmt.Errorf("begin: %w", err)}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// batchRow is the row of a batch's last statement: scanning it closes the
// batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// errRow is a row that is an error.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Lookup reads the row under req's key, its body decoded.
func (t *keyTx) Lookup(ctx context.Context, req idempotency.Request, ttl time.Duration) (idempotency.Stored, error) {
	var (
		st       idempotency.Stored
		status   *int32
		encoding *string
		op       pgtype.UUID
	)
	err := t.q.QueryRow(ctx, lookupKeySQL, req.MerchantID, req.Key, ttl).
		Scan(&st.Fingerprint, &status, &st.Response.Location, &st.Response.Body, &encoding, &op, &st.StoredAt, &st.Expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idempotency.Stored{}, nil
	case err != nil:
		return idempotency.Stored{}, keyError(fmt.Errorf("look up key: %w", err))
	}
	st.Found = true
	if op.Valid {
		st.Operation = op.Bytes
	}
	if status == nil {
		return st, nil
	}
	st.Response.Status = int(*status)
	if st.Response.Body, err = decodeBody(st.Response.Body, encoding); err != nil {
		return idempotency.Stored{}, err
	}
	return st, nil
}

// DeleteExpired deletes the key's row if it is still older than ttl.
func (t *keyTx) DeleteExpired(ctx context.Context, req idempotency.Request, ttl time.Duration) error {
	if _, err := t.q.Exec(ctx, deleteExpiredKeySQL, req.MerchantID, req.Key, ttl); err != nil {
		return keyError(fmt.Errorf("delete expired key: %w", err))
	}
	return nil
}

// Store stores resp under the claimed key, which starts its retention.
func (t *keyTx) Store(ctx context.Context, req idempotency.Request, resp idempotency.Response) (time.Time, error) {
	body, encoding := encodeBody(resp.Body)
	var storedAt time.Time
	if err := t.q.QueryRow(ctx, storeResponseSQL, req.MerchantID, req.Key, resp.Status, resp.Location, body, encoding).Scan(&storedAt); err != nil {
		return time.Time{}, keyError(fmt.Errorf("store response: %w", err))
	}
	return storedAt, nil
}

// Bind binds the claimed key to op: the row keeps no response until the
// operation's store answers it (answerKeySQL). It runs with the commit.
func (t *keyTx) Bind(_ context.Context, req idempotency.Request, op uuid.UUID) error {
	t.atCommit(bindKeySQL, req.MerchantID, req.Key, op)
	return nil
}

// Confirm makes the commit wait for the standby (durable.go): a stored
// response is answered only once the standby has it. It runs with the
// commit.
func (t *keyTx) Confirm(context.Context) error {
	t.atCommit(confirmSQL)
	return nil
}

// Commit runs the deferred statements and commits, in one round trip, on no
// request's context and confirmed by the synchronous standby, if any
// (durable.go).
func (t *keyTx) Commit(ctx context.Context) error {
	err := t.db.durably(ctx, t.conn.Conn().PgConn(), func(commitCtx context.Context) error {
		if t.tx != nil && len(t.deferred) == 0 {
			return keyError(t.tx.Commit(commitCtx))
		}
		return keyError(t.commitDeferred(commitCtx))
	})
	t.done = true
	t.db.transactionEnded()
	return err
}

// commitDeferred sends the deferred statements and COMMIT at once. On an
// error the transaction is left to Close, which rolls it back.
func (t *keyTx) commitDeferred(ctx context.Context) error {
	return execThenCommit(ctx, t.conn, t.deferred, func(br pgx.BatchResults) error {
		for range t.deferred {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close rolls back unless the transaction committed, and releases the
// connection (closed, if the rollback failed).
func (t *keyTx) Close() {
	if rolledBack(context.Background(), t.conn) {
		t.db.transactionEnded()
	}
	t.conn.Release()
}

// janitorLockKey is the advisory lock that lets one janitor run at a time.
const janitorLockKey = 0x7061796d_6a616e69 // "paymjani"

// deleteExpiredKeysSQL deletes the oldest expired keys, a bounded batch at a
// time, walking the created_at index.
const deleteExpiredKeysSQL = `
DELETE FROM idempotency_keys
WHERE (merchant_id, key) IN (
    SELECT merchant_id, key FROM idempotency_keys
    WHERE created_at < now() - $1::interval AND status IS NOT NULL
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
