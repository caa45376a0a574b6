package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// The SQL of the charge path (the use case is internal/charging; this side
// implements its port, chargedb.Store: chargedb.go): its statements, and a
// batch's first round trip, which locks its keys and accounts and reads them
// (lockBatch). The second, which writes what the batch decided and commits,
// is in chargewrite.go.

const (
	// planSQL keeps the planner to the plans these statements are written
	// for: index lookups by primary key, a few per member. Their arrays are
	// small, and stale statistics could otherwise make the planner hash a
	// whole table (idempotency_keys, accounts) once per batch. With that
	// settled, one generic plan per statement and connection serves every
	// batch, and no batch pays for planning.
	planSQL = `
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

	// tryLockKeysSQL takes each key's advisory lock if no other transaction
	// holds it, and keeps which it got (in member order) in the transaction's
	// payments.keys_locked, where lockAccountsSQL reads them in the same
	// round trip. Keys are hashed with their merchant (a uuid's text has a
	// fixed length, so the concatenation is unambiguous); two keys sharing a
	// hash only make one of them wait for the other.
	tryLockKeysSQL = `
SELECT set_config('payments.keys_locked',
    array_agg(pg_try_advisory_xact_lock(hashtextextended(m::text || k, 0)) ORDER BY i)::text, true)
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS u(m, k, i)`

	// lockKeySQL waits for one key's advisory lock (up to lock_timeout).
	lockKeySQL = `SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`

	// lookupKeysSQL reads the stored responses of the batch's keys, and the
	// transaction's clock.
	lookupKeysSQL = `
SELECT u.i, now(), ik.fingerprint, ik.status, coalesce(ik.location, ''), ik.body, ik.body_encoding, ik.created_at,
       ik.status IS NOT NULL AND ik.created_at < now() - $3::interval
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS u(m, k, i)
LEFT JOIN idempotency_keys ik ON ik.merchant_id = u.m AND ik.key = u.k
ORDER BY u.i`

	// lockAccountsSQL locks the accounts of the members whose keys this
	// transaction holds and are not stored (or have expired), in a fixed
	// order, skipping the rows another transaction has locked. A member whose
	// key is held elsewhere gets no account lock at all: it leaves the batch.
	lockAccountsSQL = `
SELECT a.merchant_id, a.id, a.currency, a.balance, a.held
FROM accounts a
WHERE (a.merchant_id, a.id) IN (
    SELECT u.m, u.a
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], current_setting('payments.keys_locked')::bool[]) AS u(m, k, a, locked)
    WHERE u.locked AND NOT EXISTS (
        SELECT FROM idempotency_keys ik
        WHERE ik.merchant_id = u.m AND ik.key = u.k AND (ik.status IS NULL OR ik.created_at >= now() - $4::interval)))
ORDER BY a.merchant_id, a.id
FOR UPDATE OF a SKIP LOCKED`

	// accountHoldsSQL sums the live holds of some locked accounts: their
	// authorizations not captured, voided or expired as of the transaction's
	// start (a clock no later than any capture's or void's that follows, so
	// a hold this batch spends as expired can no longer be captured:
	// ledger.go). It runs after lockAccountsSQL, in a statement of its own:
	// its snapshot is taken once those account locks are held, and every
	// change to an account's holds takes its lock, so it reads them as they
	// stand (lockAccountsSQL's own snapshot may predate an authorization
	// whose account row it then locked). It runs only for the accounts whose
	// held is not 0 (lockHolds): a batch of accounts that hold nothing pays
	// nothing for holds.
	accountHoldsSQL = `
SELECT c.merchant_id, c.account_id, sum(c.amount)::bigint
FROM charges c
WHERE (c.merchant_id, c.account_id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
  AND c.status = 'authorized' AND c.expires_at > now()
GROUP BY c.merchant_id, c.account_id`

	// existingAccountsSQL tells, of the accounts lockAccountsSQL did not
	// return, those that exist: another transaction holds their rows. It runs
	// only when some account did not come back, so a batch whose accounts are
	// all free and known pays nothing for it.
	existingAccountsSQL = `
SELECT a.merchant_id, a.id
FROM accounts a
WHERE (a.merchant_id, a.id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))`

	// lockTimeoutSQL bounds the lock waits of a transaction that may wait
	// (chargeAlone, a busy group): lock_timeout becomes what is left of $1
	// milliseconds counted from the transaction's start, so a key's wait and
	// then its account's share one bound.
	lockTimeoutSQL = `
SELECT set_config('lock_timeout',
    greatest(1, ceil(1000 * extract(epoch FROM now() + $1::bigint * interval '1 millisecond' - clock_timestamp())))::bigint::text, true)`

	deleteExpiredKeysOfSQL = `
DELETE FROM idempotency_keys ik
USING unnest($1::uuid[], $2::text[]) AS u(m, k)
WHERE ik.merchant_id = u.m AND ik.key = u.k AND ik.status IS NOT NULL AND ik.created_at < now() - $3::interval`

	// writeChargesSQL records a batch's decisions: the debits, the charges
	// (succeeded and failed) and their events in the members' order, created
	// at the batch's clock as their responses say, and every decided key with
	// its response (chargeRowsSQL). A key's retention counts from now, when
	// its response is stored, not from the transaction's start (which locks
	// may have delayed); it returns that time. Its arguments are named by
	// chargeWrites.namedArgs.
	writeChargesSQL = `
WITH debit AS (
    UPDATE accounts a SET balance = a.balance - d.amount, held = a.held + d.hold
    FROM unnest(@debit_merchants::uuid[], @debit_accounts::uuid[], @debit_amounts::bigint[], @debit_holds::bigint[]) AS d(m, id, amount, hold)
    WHERE a.merchant_id = d.m AND a.id = d.id
), ` + chargeRowsSQL + `
SELECT at FROM stored`

	// writeAheadSQL records a batch decided ahead (chargeahead.go) as
	// writeChargesSQL does, in the statement that checks the premises it was
	// decided on, and returns the same time. The debits name every account
	// of the batch (a debit of 0 for one whose members were all declined)
	// with the currency and balance it was decided against, and change only
	// an account that has them and holds nothing. The main query checks, in
	// order, before any charge, event or key row is written (those CTEs run
	// after it): the batch's clock is not after the database's and less than
	// a second behind the transaction's start; this transaction takes every
	// key's advisory lock (none in flight elsewhere); every account was
	// debited. A failed check raises PA001 (payments_charge_batch_refused,
	// migration 0031). A key stored already makes the key row's insert
	// conflict (23505 on idempotency_keys_pkey), and a row another
	// transaction holds makes a wait that planAheadSQL's lock_timeout ends
	// (55P03): every refusal rolls the whole transaction back.
	writeAheadSQL = `
WITH debit AS (
    UPDATE accounts a SET balance = a.balance - d.amount, held = a.held + d.hold
    FROM unnest(@debit_merchants::uuid[], @debit_accounts::uuid[], @debit_amounts::bigint[], @debit_holds::bigint[],
                @expected_currencies::text[], @expected_balances::bigint[]) AS d(m, id, amount, hold, currency, balance)
    WHERE a.merchant_id = d.m AND a.id = d.id AND a.currency = d.currency AND a.balance = d.balance AND a.held = 0
    RETURNING 1
), ` + chargeRowsSQL + `
SELECT CASE
    WHEN @batch_clock::timestamptz > clock_timestamp() OR @batch_clock::timestamptz < now() - interval '1 second'
        THEN payments_charge_batch_refused('the batch''s clock is not the database''s')
    WHEN NOT (SELECT bool_and(pg_try_advisory_xact_lock(hashtextextended(u.m::text || u.k, 0)))
              FROM unnest(@key_merchants::uuid[], @keys::text[]) AS u(m, k))
        THEN payments_charge_batch_refused('a key of the batch is in flight')
    WHEN (SELECT count(*) FROM debit) <> cardinality(@debit_accounts::uuid[])
        THEN payments_charge_batch_refused('an account of the batch is not as recorded')
    ELSE at END
FROM stored`

	// chargeRowsSQL is what writeChargesSQL and writeAheadSQL write after
	// the debits: the charges and their events in the members' order, the
	// moment the responses are stored, and the keys' rows.
	chargeRowsSQL = `charge AS (
    INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, failure_code, amount_captured, expires_at, description, metadata, created_at)
    SELECT m, id, a, amount, currency, status, nullif(failure, ''), captured, expires, description, metadata, created
    FROM unnest(@charge_merchants::uuid[], @charge_ids::uuid[], @charge_accounts::uuid[], @charge_amounts::bigint[], @currencies::text[], @statuses::text[], @failures::text[], @captured::bigint[], @expires::timestamptz[], @descriptions::text[], @metadata::jsonb[], @created::timestamptz[])
        WITH ORDINALITY AS c(m, id, a, amount, currency, status, failure, captured, expires, description, metadata, created, i)
    ORDER BY i
), event AS (
    INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload, created_at)
    SELECT m, id, 'charge', aggregate, type, payload, created
    FROM unnest(@charge_merchants::uuid[], @event_ids::uuid[], @charge_ids::uuid[], @event_types::text[], @payloads::jsonb[], @created::timestamptz[]) WITH ORDINALITY AS e(m, id, aggregate, type, payload, created, i)
    ORDER BY i
), stored AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), keyrow AS (
    INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, body_encoding, created_at)
    SELECT k.*, stored.at FROM unnest(@key_merchants::uuid[], @keys::text[], @fingerprints::bytea[], @key_statuses::smallint[], @locations::text[], @bodies::bytea[], @body_encodings::text[]) AS k, stored
)`
)

// chargeStatements are the statements of a charge batch that a benchmark replaces
// to price the idempotency key (see BenchmarkKeyClaimOverhead).
type chargeStatements struct {
	tryLockKeys, lookupKeys, lockAccounts, write, writeAhead string
}

var defaultChargeStatements = chargeStatements{tryLockKeysSQL, lookupKeysSQL, lockAccountsSQL, writeChargesSQL, writeAheadSQL}

// lockBatch runs a batch's first round trip on conn: BEGIN, the members' key
// locks, their stored responses and their accounts (see the top of
// internal/charging/charging.go), and, when some account did not come back,
// findBusy.
func (s *ChargeDB) lockBatch(ctx context.Context, conn *pgxpool.Conn, reqs []chargedb.KeyedCharge, mode chargedb.Waits) (*chargedb.Locks, error) {
	n := len(reqs)
	merchants, keys, accountIDs := make([]pgtype.UUID, n), make([]string, n), make([]pgtype.UUID, n)
	for i, r := range reqs {
		merchants[i], keys[i], accountIDs[i] = pgUUID(r.Request.MerchantID), r.Request.Key, pgUUID(r.Charge.AccountID)
	}

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(planSQL)
	waiting := mode.Key || mode.Accounts
	left := (time.Until(mode.Deadline) + time.Millisecond - 1).Milliseconds() // rounded up: never before the deadline
	if waiting {
		b.Queue(lockTimeoutSQL, left)
	}
	if mode.Key {
		b.Queue(lockKeySQL, merchants[0], keys[0])
	}
	b.Queue(s.chargeSQL.tryLockKeys, merchants, keys)
	b.Queue(s.chargeSQL.lookupKeys, merchants, keys, s.opts.KeyTTL)
	lockAccounts := s.chargeSQL.lockAccounts
	if mode.Accounts {
		b.Queue(lockTimeoutSQL, left)
		lockAccounts = strings.Replace(lockAccounts, " SKIP LOCKED", "", 1)
	}
	b.Queue(lockAccounts, merchants, keys, accountIDs, s.opts.KeyTTL)
	br := conn.SendBatch(ctx, b)
	locks, err := readLocks(br, n, mode)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err == nil && !mode.Accounts {
		err = findBusy(ctx, conn, reqs, locks)
	}
	if err == nil {
		err = readHolds(ctx, conn, locks.Accounts)
	}
	return locks, err
}

// readLocks reads the answers of round trip 1.
func readLocks(br pgx.BatchResults, n int, mode chargedb.Waits) (*chargedb.Locks, error) {
	r := &chargedb.Locks{}
	for range 2 { // BEGIN, planSQL
		if _, err := br.Exec(); err != nil {
			return r, fmt.Errorf("begin: %w", err)
		}
	}
	if mode.Key || mode.Accounts {
		if _, err := br.Exec(); err != nil {
			return r, fmt.Errorf("bound lock waits: %w", err)
		}
	}
	if mode.Key {
		if _, err := br.Exec(); err != nil {
			if hasCode(err, codeLockNotAvailable) {
				err = idempotency.ErrKeyInUse // the twin is still in flight after the whole bound
			}
			return r, err
		}
	}
	var locked string
	if err := br.QueryRow().Scan(&locked); err != nil {
		return r, fmt.Errorf("lock keys: %w", err)
	}
	if r.KeyHeld = parseBools(locked); len(r.KeyHeld) != n {
		return r, fmt.Errorf("lock keys: %d answers for %d keys", len(r.KeyHeld), n)
	}

	var err error
	if r.Stored, r.Now, err = readStoredKeys(br, n); err != nil {
		return r, err
	}

	if mode.Accounts {
		if _, err := br.Exec(); err != nil {
			return r, fmt.Errorf("bound lock waits: %w", err)
		}
	}
	r.Accounts, r.Busy = make(map[chargedb.AccountKey]*payment.Account), make(map[chargedb.AccountKey]bool)
	rows, _ := br.Query()
	for rows.Next() {
		a := &payment.Account{}
		// Held is, for now, every authorization's amount, expired or not
		// (accounts.held); readHolds makes it the live holds'.
		if err := rows.Scan(&a.MerchantID, &a.ID, &a.Currency, &a.Balance, &a.Held); err != nil {
			rows.Close()
			return r, fmt.Errorf("lock accounts: %w", err)
		}
		r.Accounts[chargedb.AccountKey{Merchant: a.MerchantID, ID: a.ID}] = a
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("lock accounts: %w", err)
	}
	return r, nil
}

// readHolds makes the locked accounts' Held their live holds: 0 where the
// account holds nothing (held 0, read under its lock), else summed by
// accountHoldsSQL, in one more round trip, only when some account holds
// anything.
func readHolds(ctx context.Context, conn *pgxpool.Conn, accounts map[chargedb.AccountKey]*payment.Account) error {
	var merchants, ids []pgtype.UUID
	for ak, a := range accounts {
		if a.Held != 0 {
			merchants, ids = append(merchants, pgUUID(ak.Merchant)), append(ids, pgUUID(ak.ID))
			a.Held = 0 // until accountHoldsSQL finds live holds
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, _ := conn.Query(ctx, accountHoldsSQL, merchants, ids)
	defer rows.Close()
	for rows.Next() {
		var (
			ak   chargedb.AccountKey
			held int64
		)
		if err := rows.Scan(&ak.Merchant, &ak.ID, &held); err != nil {
			return fmt.Errorf("read holds: %w", err)
		}
		if a := accounts[ak]; a != nil {
			a.Held = held
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read holds: %w", err)
	}
	return nil
}

// readStoredKeys reads lookupKeysSQL's rows: by member, the response stored
// under its key, and the transaction's clock.
func readStoredKeys(br pgx.BatchResults, n int) ([]chargedb.StoredKey, time.Time, error) {
	stored := make([]chargedb.StoredKey, n)
	var now time.Time
	rows, _ := br.Query()
	defer rows.Close()
	for rows.Next() {
		var (
			i         int64
			k         chargedb.StoredKey
			status    *int32
			encoding  *string
			createdAt *time.Time
			expired   *bool
		)
		if err := rows.Scan(&i, &now, &k.Fingerprint, &status, &k.Resp.Location, &k.Resp.Body, &encoding, &createdAt, &expired); err != nil {
			return nil, now, fmt.Errorf("look up keys: %w", err)
		}
		if createdAt != nil {
			k.Found, k.StoredAt, k.Expired = true, *createdAt, *expired
		}
		if status != nil {
			k.Resp.Status = int(*status)
		}
		if k.Found && !k.Expired {
			k.Resp.Body, k.DecodeErr = decodeBody(k.Resp.Body, encoding)
		}
		stored[i-1] = k
	}
	if err := rows.Err(); err != nil {
		return nil, now, fmt.Errorf("look up keys: %w", err)
	}
	return stored, now, nil
}

// findBusy fills r.Busy after a batch's round trip 1: of the accounts its
// members wanted locked (their keys held here and not stored), those that
// did not come back either do not exist (404) or are locked by another
// transaction, skipped. One more round trip tells which, only when there are
// any.
func findBusy(ctx context.Context, conn *pgxpool.Conn, reqs []chargedb.KeyedCharge, r *chargedb.Locks) error {
	var merchants, ids []pgtype.UUID
	seen := make(map[chargedb.AccountKey]bool)
	for i, req := range reqs {
		ak := req.Account()
		if !r.KeyHeld[i] || (r.Stored[i].Found && !r.Stored[i].Expired) || r.Accounts[ak] != nil || seen[ak] {
			continue
		}
		seen[ak] = true
		merchants, ids = append(merchants, pgUUID(ak.Merchant)), append(ids, pgUUID(ak.ID))
	}
	if len(ids) == 0 {
		return nil
	}
	rows, _ := conn.Query(ctx, existingAccountsSQL, merchants, ids)
	defer rows.Close()
	for rows.Next() {
		var ak chargedb.AccountKey
		if err := rows.Scan(&ak.Merchant, &ak.ID); err != nil {
			return fmt.Errorf("find busy accounts: %w", err)
		}
		r.Busy[ak] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("find busy accounts: %w", err)
	}
	return nil
}

// parseBools reads a PostgreSQL boolean array's text, such as {t,f,t}.
func parseBools(s string) []bool {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if s == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	out := make([]bool, len(parts))
	for i, p := range parts {
		out[i] = p == "t"
	}
	return out
}
