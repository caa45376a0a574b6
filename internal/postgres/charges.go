package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"payments/internal/groupcommit"
	"payments/internal/idempotency"
	"payments/internal/payment"
)

// The charge path. Every charge, whatever its outcome, goes through chargeTx,
// which runs a batch of charges (one, or many gathered by internal/groupcommit)
// in one transaction and one commit. A batch waits for no lock that another
// transaction holds, so no member ever waits, or fails, for another's reason:
//
//  1. One round trip: BEGIN; the advisory lock of every member's key, taken
//     without waiting; the stored responses of those keys; the accounts of the
//     members whose keys this batch holds and are not stored, locked FOR
//     UPDATE SKIP LOCKED in (merchant_id, id) order. Only when an account did
//     not come back, one more round trip tells an unknown account from one
//     another transaction holds (findBusy).
//  2. In Go, member by member in order: a member whose key another
//     transaction holds leaves the batch, its account untouched (it then
//     waits for the key alone, holding nothing: chargewait.go); a stored key
//     is replayed (or refused as reused) without touching accounts or
//     charges; a key already seen in this batch answers from its first
//     member (or leaves with it); a member whose account row another
//     transaction holds leaves the batch with its account's other members
//     (they wait for the row together, chargewait.go); every other member is
//     decided by payment.ChargeAccount against the balance the members before
//     it left, and its answer rendered.
//  3. One round trip: expired keys deleted, balances, charges (succeeded and
//     failed), events and key rows with their responses written by one
//     statement over arrays, and COMMIT.
//
// If a member's own statement fails, the batch is split in halves until that
// member runs alone (chargeBatch). A member that left waits at most
// IDEMPOTENCY_WAIT after its batch: 409 for a key still in flight, 503 for a
// row still locked. A charge waits at most IDEMPOTENCY_WAIT in the queue for
// a batch (503 past it, never executed); a batch older than IDEMPOTENCY_WAIT
// plus COMMIT_WAIT is stuck, and /readyz says so (Moving).
//
// The clock is the database's: every row and every rendered created_at of a
// batch is the transaction's now(), except the key rows' created_at, which
// starts their retention when the responses are stored.
//
// Lock order, everywhere in the service: an idempotency key's advisory lock
// (waited for only by a transaction that holds nothing yet), then accounts in
// (merchant_id, id) order, then charges, then the key's row. A key's advisory lock is held by whichever
// transaction writes that key's row, so a batch never waits on a key's index
// entry while it holds accounts. Only transactions that hold no account
// wait for an account: a busy group (which holds its members' keys) and a
// charge alone (its own key), each bounded by IDEMPOTENCY_WAIT.

// chargeAnswer is a batch's answer for one member: its result, or why it
// left the batch to wait alone, holding nothing its batch-mates need.
type chargeAnswer struct {
	res idempotency.Result
	err error
	// inFlight: another transaction holds the member's key; it waits for
	// that transaction alone (chargeAlone).
	inFlight bool
	// busy: another transaction holds the member's account row; it waits
	// for the row with its account's other busy members (busyGroup).
	busy bool
	// group and member, for a busy member: the group it waits in and its
	// place there (set by formBusyGroups).
	group  *busyGroup
	member int
	// deadline, for a member that left: when it stops waiting, IDEMPOTENCY_WAIT
	// after its batch ended.
	deadline time.Time
}

func (a chargeAnswer) left() bool { return a.inFlight || a.busy }

// CreateCharge executes req at most once per (merchant, key), in a batch with the
// charges running concurrently in this process. Its result is req's rendered
// response, or the replay of the one stored under the key; the errors are
// those of Idempotent, and payment.ErrUnavailable when the charge waited the
// bound for the batcher or for a locked account, or when its client left while
// its batch ran (the outcome then goes to Options.OnAbandoned, and a retry
// with the key answers it).
func (s *ChargePath) CreateCharge(ctx context.Context, req idempotency.ChargeRequest) (idempotency.Result, error) {
	ans, err := s.charges.Do(ctx, req)
	switch {
	case errors.Is(err, groupcommit.ErrAbandoned):
		return idempotency.Result{}, errOutcomeUnknown
	case errors.Is(err, groupcommit.ErrQueueTimeout):
		return idempotency.Result{}, fmt.Errorf("%w: no charge batch was free within IDEMPOTENCY_WAIT; the charge was not executed", payment.ErrUnavailable)
	case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
		// Its client left while it was queued: never executed.
		s.reportAbandoned(req, chargeAnswer{err: fmt.Errorf("%w: its client left while it was queued: %w", errNotExecuted, err)}, nil)
		return idempotency.Result{}, err
	case err != nil:
		return idempotency.Result{}, asUnavailable(err)
	}
	if ans.group != nil {
		if ans, err = ans.group.wait(ctx, ans.member); err != nil {
			return idempotency.Result{}, err
		}
	}
	res, err := ans.res, ans.err
	if ans.inFlight {
		res, err = s.chargeAlone(ctx, req, ans.deadline)
	}
	if ctx.Err() != nil {
		// Its client has left, so the answer reaches nobody: say what became
		// of the charge.
		s.reportAbandoned(req, chargeAnswer{res: res, err: err}, nil)
	}
	return res, err
}

// errOutcomeUnknown answers a charge whose client left while its batch was
// running: it may have committed. Its outcome is reported when known, and a
// retry with the same key answers it.
var errOutcomeUnknown = fmt.Errorf("%w: the client left while its charge was being decided; a retry with the same Idempotency-Key answers it",
	payment.ErrUnavailable)

// newChargeBatcher is the group commit of charges, running run (runBatch).
// A batch runs on no request's context (one client going away must not abort
// its neighbours), and waits for no lock another transaction holds
// (chargeTx); a queued charge waits at most KeyWait for it.
func (s *ChargePath) newChargeBatcher(run groupcommit.Run[idempotency.ChargeRequest, chargeAnswer]) *groupcommit.Batcher[idempotency.ChargeRequest, chargeAnswer] {
	return groupcommit.New(context.Background(), run, groupcommit.Options[idempotency.ChargeRequest, chargeAnswer]{
		MaxSize:     s.opts.ChargeBatchSize,
		Concurrency: s.opts.ChargeBatches,
		MaxWait:     s.opts.KeyWait,
		Abandoned:   s.reportAbandoned,
	})
}

// ChargeStats describes the charge batcher at this moment, for metrics.
func (s *ChargePath) ChargeStats() groupcommit.Stats { return s.charges.Stats() }

// StuckAfter is the age past which a charge batch is stuck: every wait of a
// batch ends within KeyWait (IDEMPOTENCY_WAIT), and its commit's wait for the
// standby within CommitWait (COMMIT_WAIT).
func (s *ChargePath) StuckAfter() time.Duration { return s.opts.KeyWait + s.opts.CommitWait }

// Moving returns payment.ErrUnavailable while a charge batch has run longer
// than StuckAfter: charges are not being decided in this process.
func (s *ChargePath) Moving() error {
	if age := s.charges.Stats().BatchAge; age > s.StuckAfter() {
		return fmt.Errorf("%w: the charge path is stuck: a batch has run for %s, past IDEMPOTENCY_WAIT + COMMIT_WAIT (%s)",
			payment.ErrUnavailable, age.Round(time.Millisecond), s.StuckAfter())
	}
	return nil
}

// runBatch runs one group-committed batch. Its members that left (a key in
// flight, an account locked elsewhere) get their deadline, and the busy ones
// their groups, which start waiting at once on goroutines of their own: the
// batcher goes on with the next batch.
func (s *ChargePath) runBatch(ctx context.Context, reqs []idempotency.ChargeRequest) ([]chargeAnswer, error) {
	// Every wait of a batch is bounded (it waits for no lock held
	// elsewhere, and the commit has CommitWait of its own); this is the
	// backstop.
	ctx, cancel := context.WithTimeout(ctx, s.opts.KeyWait)
	defer cancel()
	answers, err := s.chargeBatch(ctx, reqs, waits{})
	if err != nil {
		return nil, err
	}
	s.formBusyGroups(reqs, answers, time.Now().Add(s.opts.KeyWait))
	return answers, nil
}

// chargeAlone runs req as a transaction of its own that waits (until
// deadline) for the transaction holding its key, and then for its account,
// holding nothing but its own key while it waits.
func (s *ChargePath) chargeAlone(ctx context.Context, req idempotency.ChargeRequest, deadline time.Time) (idempotency.Result, error) {
	release, err := s.startWaiting(ctx, deadline)
	if err != nil {
		return idempotency.Result{}, err
	}
	defer release()
	answers, err := s.chargeBatch(ctx, []idempotency.ChargeRequest{req}, waits{key: true, accounts: true, deadline: deadline})
	if err != nil {
		return idempotency.Result{}, err
	}
	return answers[0].res, answers[0].err
}

// chargeBatch runs reqs in one transaction (chargeTx), again after a
// deadlock, a serialization failure or a key row that appeared under it, up to
// maxAttempts times. Any other failure while the database is there belongs to
// some member (a statement of its own failed): the batch is split in two and
// each half runs on its own, down to that member, so that it alone gets the
// error and everyone else the answer they would have had alone.
func (s *ChargePath) chargeBatch(ctx context.Context, reqs []idempotency.ChargeRequest, mode waits) ([]chargeAnswer, error) {
	var err error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		var (
			answers []chargeAnswer
			events  int
		)
		if answers, events, err = s.chargeTx(ctx, reqs, mode); err == nil {
			if events > 0 {
				s.eventsCommitted()
			}
			return answers, nil
		}
		if !retryable(err) && !hasCode(err, codeUniqueViolation) {
			break
		}
	}
	err = asUnavailable(err)
	if len(reqs) == 1 || retryable(err) || errors.Is(err, payment.ErrUnavailable) ||
		errors.Is(err, idempotency.ErrKeyInUse) || ctx.Err() != nil {
		return nil, err // the batch's fate, not one member's
	}
	half := len(reqs) / 2
	answers := make([]chargeAnswer, 0, len(reqs))
	for _, part := range [][]idempotency.ChargeRequest{reqs[:half], reqs[half:]} {
		got, err := s.chargeBatch(ctx, part, mode)
		if err != nil {
			got = make([]chargeAnswer, len(part))
			for i := range got {
				got[i].err = err
			}
		}
		answers = append(answers, got...)
	}
	return answers, nil
}

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
       ik.created_at < now() - $3::interval
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS u(m, k, i)
LEFT JOIN idempotency_keys ik ON ik.merchant_id = u.m AND ik.key = u.k
ORDER BY u.i`

	// lockAccountsSQL locks the accounts of the members whose keys this
	// transaction holds and are not stored (or have expired), in a fixed
	// order, skipping the rows another transaction has locked. A member whose
	// key is held elsewhere gets no account lock at all: it leaves the batch.
	lockAccountsSQL = `
SELECT a.merchant_id, a.id, a.currency, a.balance
FROM accounts a
WHERE (a.merchant_id, a.id) IN (
    SELECT u.m, u.a
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], current_setting('payments.keys_locked')::bool[]) AS u(m, k, a, locked)
    WHERE u.locked AND NOT EXISTS (
        SELECT FROM idempotency_keys ik
        WHERE ik.merchant_id = u.m AND ik.key = u.k AND ik.created_at >= now() - $4::interval))
ORDER BY a.merchant_id, a.id
FOR UPDATE OF a SKIP LOCKED`

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
WHERE ik.merchant_id = u.m AND ik.key = u.k AND ik.created_at < now() - $3::interval`

	// writeChargesSQL records a batch's decisions: the debits, the charges
	// (succeeded and failed) and their events in the members' order, and every
	// decided key with its response. A key's retention counts from now, when
	// its response is stored, not from the transaction's start (which locks
	// may have delayed); it returns that time.
	writeChargesSQL = `
WITH debit AS (
    UPDATE accounts a SET balance = a.balance - d.amount
    FROM unnest($1::uuid[], $2::uuid[], $3::bigint[]) AS d(m, id, amount)
    WHERE a.merchant_id = d.m AND a.id = d.id
), charge AS (
    INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, failure_code, description, metadata)
    SELECT m, id, a, amount, currency, status, nullif(failure, ''), description, metadata
    FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[], $12::jsonb[])
        WITH ORDINALITY AS c(m, id, a, amount, currency, status, failure, description, metadata, i)
    ORDER BY i
), event AS (
    INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
    SELECT m, id, 'charge', aggregate, type, payload
    FROM unnest($4::uuid[], $13::uuid[], $5::uuid[], $14::text[], $15::jsonb[]) WITH ORDINALITY AS e(m, id, aggregate, type, payload, i)
    ORDER BY i
), stored AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), keyrow AS (
    INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, body_encoding, created_at)
    SELECT k.*, stored.at FROM unnest($16::uuid[], $17::text[], $18::bytea[], $19::smallint[], $20::text[], $21::bytea[], $22::text[]) AS k, stored
)
SELECT at FROM stored`
)

// waits is what a chargeTx may wait for, until deadline: nothing (a batch),
// its members' account rows (a busy group), or also its one member's key
// (chargeAlone).
type waits struct {
	key, accounts bool
	deadline      time.Time
}

// chargeTx runs one batch in one transaction (see the top of this file). It
// reports how many events it wrote.
//
//nolint:funlen // its decision loop moves into the charge use case's own package (issue 25)
func (s *ChargePath) chargeTx(ctx context.Context, reqs []idempotency.ChargeRequest, mode waits) (answers []chargeAnswer, events int, err error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Release()
	defer func() {
		if err != nil {
			rollback(ctx, conn)
		}
	}()

	n := len(reqs)
	merchants, keys, accountIDs := make([]pgtype.UUID, n), make([]string, n), make([]pgtype.UUID, n)
	for i, r := range reqs {
		merchants[i], keys[i], accountIDs[i] = pgUUID(r.Key.MerchantID), r.Key.Key, pgUUID(r.Charge.AccountID)
	}

	// Round trip 1: lock the keys, read them and the accounts.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(planSQL)
	waiting := mode.key || mode.accounts
	left := (time.Until(mode.deadline) + time.Millisecond - 1).Milliseconds() // rounded up: never before the deadline
	if waiting {
		b.Queue(lockTimeoutSQL, left)
	}
	if mode.key {
		b.Queue(lockKeySQL, merchants[0], keys[0])
	}
	b.Queue(s.chargeSQL.tryLockKeys, merchants, keys)
	b.Queue(s.chargeSQL.lookupKeys, merchants, keys, s.opts.KeyTTL)
	lockAccounts := s.chargeSQL.lockAccounts
	if mode.accounts {
		b.Queue(lockTimeoutSQL, left)
		lockAccounts = strings.Replace(lockAccounts, " SKIP LOCKED", "", 1)
	}
	b.Queue(lockAccounts, merchants, keys, accountIDs, s.opts.KeyTTL)
	br := conn.SendBatch(ctx, b)
	locks, err := readLocks(br, n, mode)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err == nil && !mode.accounts {
		err = findBusy(ctx, conn, reqs, &locks)
	}
	if err != nil {
		return nil, 0, err
	}

	// Decide, member by member.
	answers = make([]chargeAnswer, n)
	decided := make([]bool, n) // answered by this batch's execution, not a stored row
	var (
		w        chargeWrites
		replayed bool // some answer comes from a stored row: confirm it (durable.go)
	)
	first := make(map[idempotency.Request]int, n) // by (merchant, key): the member that executed it
	for i, r := range reqs {
		id := idempotency.Request{MerchantID: r.Key.MerchantID, Key: r.Key.Key}
		j, seen := first[id]
		switch {
		case !locks.keys[i]:
			answers[i].inFlight = true
		case locks.stored[i].found && !locks.stored[i].expired:
			replayed = true
			answers[i].res, answers[i].err = replayStored(r.Key, locks.stored[i])
		case seen && answers[j].left():
			// Its key's first member left the batch: it waits for that
			// one's outcome, as it would have alone.
			answers[i].inFlight = true
		case seen: // j's answer is final: it was decided above
			answers[i] = sameKey(r.Key, reqs[j].Key, answers[j])
			decided[i] = true
		case locks.busy[accountKey{r.Key.MerchantID, r.Charge.AccountID}]:
			first[id] = i
			answers[i].busy = true
		default:
			first[id] = i
			decided[i] = true
			if locks.stored[i].found {
				w.deleteExpired(r.Key)
			}
			answers[i].res, answers[i].err = w.decide(r, locks.accounts, locks.now)
		}
	}

	// Round trip 2: write and commit, on no request's context and confirmed
	// by the synchronous standby, if any (durable.go).
	b = &pgx.Batch{}
	if len(w.expiredMerchants) > 0 {
		b.Queue(deleteExpiredKeysOfSQL, w.expiredMerchants, w.expiredKeys, s.opts.KeyTTL)
	}
	if len(w.keyMerchants) > 0 {
		b.Queue(s.chargeSQL.write, w.args()...)
	}
	if replayed {
		b.Queue(confirmSQL)
	}
	b.Queue("COMMIT")
	commitCtx, cancel := s.commitContext(ctx)
	defer cancel()
	takeWarning(conn.Conn().PgConn())
	storedAt, err := writeAndCommit(conn.SendBatch(commitCtx, b), len(w.expiredMerchants) > 0, len(w.keyMerchants) > 0, replayed)
	if err != nil {
		return nil, 0, fmt.Errorf("write charges: %w", err)
	}
	if warning := takeWarning(conn.Conn().PgConn()); warning != nil {
		return nil, 0, errNotConfirmed(warning)
	}
	for i := range answers {
		if decided[i] && answers[i].err == nil {
			answers[i].res.StoredAt = storedAt
		}
	}
	return answers, len(w.eventIDs), nil
}

// writeAndCommit reads the answers of round trip 2: the time the keys'
// responses were stored, if any were.
func writeAndCommit(br pgx.BatchResults, deleted, wrote, confirmed bool) (storedAt time.Time, err error) {
	defer func() {
		if closeErr := br.Close(); err == nil {
			err = closeErr
		}
	}()
	if deleted {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, err
		}
	}
	if wrote {
		if err := br.QueryRow().Scan(&storedAt); err != nil {
			return time.Time{}, err
		}
	}
	if confirmed {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, err
		}
	}
	_, err = br.Exec()
	return storedAt, err
}

// chargeStatements are the statements of chargeTx that a benchmark replaces
// to price the idempotency key (see BenchmarkKeyClaimOverhead).
type chargeStatements struct {
	tryLockKeys, lookupKeys, lockAccounts, write string
}

var defaultChargeStatements = chargeStatements{tryLockKeysSQL, lookupKeysSQL, lockAccountsSQL, writeChargesSQL}

// keyRow is what lookupKeysSQL found under one member's key.
type keyRow struct {
	found, expired bool
	fingerprint    []byte
	status         *int32
	resp           idempotency.Response
	encoding       *string
	storedAt       time.Time
}

type accountKey struct{ merchant, id uuid.UUID }

// lockResult is what round trip 1 found.
type lockResult struct {
	keys     []bool   // by member: this transaction holds its key's lock
	stored   []keyRow // by member: the row stored under its key
	now      time.Time
	accounts map[accountKey]*payment.Account // locked here
	busy     map[accountKey]bool             // locked by another transaction (findBusy)
}

// readLocks reads the answers of round trip 1.
func readLocks(br pgx.BatchResults, n int, mode waits) (lockResult, error) {
	var r lockResult
	for range 2 { // BEGIN, planSQL
		if _, err := br.Exec(); err != nil {
			return r, fmt.Errorf("begin: %w", err)
		}
	}
	if mode.key || mode.accounts {
		if _, err := br.Exec(); err != nil {
			return r, fmt.Errorf("bound lock waits: %w", err)
		}
	}
	if mode.key {
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
	if r.keys = parseBools(locked); len(r.keys) != n {
		return r, fmt.Errorf("lock keys: %d answers for %d keys", len(r.keys), n)
	}

	r.stored = make([]keyRow, n)
	rows, _ := br.Query()
	for rows.Next() {
		var (
			i         int64
			k         keyRow
			createdAt *time.Time
			expired   *bool
		)
		if err := rows.Scan(&i, &r.now, &k.fingerprint, &k.status, &k.resp.Location, &k.resp.Body, &k.encoding, &createdAt, &expired); err != nil {
			rows.Close()
			return r, fmt.Errorf("look up keys: %w", err)
		}
		if createdAt != nil {
			k.found, k.storedAt, k.expired = true, *createdAt, *expired
		}
		r.stored[i-1] = k
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("look up keys: %w", err)
	}

	if mode.accounts {
		if _, err := br.Exec(); err != nil {
			return r, fmt.Errorf("bound lock waits: %w", err)
		}
	}
	r.accounts, r.busy = make(map[accountKey]*payment.Account), make(map[accountKey]bool)
	rows, _ = br.Query()
	for rows.Next() {
		a := &payment.Account{}
		if err := rows.Scan(&a.MerchantID, &a.ID, &a.Currency, &a.Balance); err != nil {
			rows.Close()
			return r, fmt.Errorf("lock accounts: %w", err)
		}
		r.accounts[accountKey{a.MerchantID, a.ID}] = a
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("lock accounts: %w", err)
	}
	return r, nil
}

// findBusy fills r.busy after a batch's round trip 1: of the accounts its
// members wanted locked (their keys held here and not stored), those that
// did not come back either do not exist (404) or are locked by another
// transaction, skipped. One more round trip tells which, only when there are
// any.
func findBusy(ctx context.Context, conn *pgxpool.Conn, reqs []idempotency.ChargeRequest, r *lockResult) error {
	var merchants, ids []pgtype.UUID
	seen := make(map[accountKey]bool)
	for i, req := range reqs {
		ak := accountKey{req.Key.MerchantID, req.Charge.AccountID}
		if !r.keys[i] || (r.stored[i].found && !r.stored[i].expired) || r.accounts[ak] != nil || seen[ak] {
			continue
		}
		seen[ak] = true
		merchants, ids = append(merchants, pgUUID(ak.merchant)), append(ids, pgUUID(ak.id))
	}
	if len(ids) == 0 {
		return nil
	}
	rows, _ := conn.Query(ctx, existingAccountsSQL, merchants, ids)
	defer rows.Close()
	for rows.Next() {
		var ak accountKey
		if err := rows.Scan(&ak.merchant, &ak.id); err != nil {
			return fmt.Errorf("find busy accounts: %w", err)
		}
		r.busy[ak] = true
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

// replayStored answers req from the response stored under its key.
func replayStored(req idempotency.Request, k keyRow) (idempotency.Result, error) {
	if k.status == nil || len(k.fingerprint) != len(req.Fingerprint) {
		// Cannot happen: the row and its response commit together.
		return idempotency.Result{}, errors.New("stored idempotency key has no response")
	}
	resp := k.resp
	resp.Status = int(*k.status)
	var err error
	if resp.Body, err = decodeBody(resp.Body, k.encoding); err != nil {
		return idempotency.Result{}, err
	}
	res, err := idempotency.Replay(req, idempotency.Fingerprint(k.fingerprint), resp)
	res.StoredAt = k.storedAt
	return res, err
}

// sameKey answers a member whose key an earlier member of the batch executed,
// as if it had arrived just after that member committed.
func sameKey(req, firstReq idempotency.Request, first chargeAnswer) chargeAnswer {
	switch {
	case first.err != nil:
		return chargeAnswer{err: first.err}
	}
	res, err := idempotency.Replay(req, firstReq.Fingerprint, first.res.Response)
	res.StoredAt = first.res.StoredAt
	return chargeAnswer{res: res, err: err}
}

// chargeWrites gathers a batch's writes as the columns of writeChargesSQL.
type chargeWrites struct {
	expiredMerchants []uuid.UUID
	expiredKeys      []string

	debitMerchants, debitAccounts []uuid.UUID
	debitAmounts                  []int64
	debitIndex                    map[accountKey]int

	chargeMerchants, chargeIDs, chargeAccounts []uuid.UUID
	chargeAmounts                              []int64
	currencies, statuses, failures             []string
	descriptions                               []*string
	metadata                                   [][]byte
	eventIDs                                   []uuid.UUID
	eventTypes                                 []string
	payloads                                   [][]byte

	keyMerchants  []uuid.UUID
	keys          []string
	fingerprints  [][]byte
	keyStatuses   []int16
	locations     []*string
	bodies        [][]byte
	bodyEncodings []*string
}

func (w *chargeWrites) deleteExpired(req idempotency.Request) {
	w.expiredMerchants = append(w.expiredMerchants, req.MerchantID)
	w.expiredKeys = append(w.expiredKeys, req.Key)
}

// decide decides one member's charge against the accounts as the members
// before it left them, renders its answer, and adds what it writes.
func (w *chargeWrites) decide(r idempotency.ChargeRequest, accounts map[accountKey]*payment.Account, now time.Time) (idempotency.Result, error) {
	ak := accountKey{r.Key.MerchantID, r.Charge.AccountID}
	c, refused := payment.ChargeAccount(accounts[ak], payment.NewID(), r.Charge, now)
	var payload []byte
	if refused == nil {
		var err error
		if payload, err = c.MarshalJSON(); err != nil {
			return idempotency.Result{}, err
		}
	}
	resp, err := r.Render(c, payload, refused)
	if err != nil {
		return idempotency.Result{}, err
	}
	if refused == nil {
		if err := w.addCharge(r.Key.MerchantID, c, payload); err != nil {
			return idempotency.Result{}, err
		}
		if c.Status == payment.ChargeSucceeded {
			w.debit(ak, c.Amount)
		}
	}
	w.addKey(r.Key, resp)
	return idempotency.Result{Response: resp}, nil
}

func (w *chargeWrites) debit(ak accountKey, amount int64) {
	if w.debitIndex == nil {
		w.debitIndex = make(map[accountKey]int)
	}
	if i, ok := w.debitIndex[ak]; ok {
		w.debitAmounts[i] += amount
		return
	}
	w.debitIndex[ak] = len(w.debitAmounts)
	w.debitMerchants = append(w.debitMerchants, ak.merchant)
	w.debitAccounts = append(w.debitAccounts, ak.id)
	w.debitAmounts = append(w.debitAmounts, amount)
}

func (w *chargeWrites) addCharge(merchant uuid.UUID, c payment.Charge, payload []byte) error {
	metadata, err := json.Marshal(c.Metadata)
	if err != nil {
		return err
	}
	eventType := payment.EventChargeSucceeded
	if c.Status == payment.ChargeFailed {
		eventType = payment.EventChargeFailed
	}
	w.chargeMerchants = append(w.chargeMerchants, merchant)
	w.chargeIDs = append(w.chargeIDs, c.ID)
	w.chargeAccounts = append(w.chargeAccounts, c.AccountID)
	w.chargeAmounts = append(w.chargeAmounts, c.Amount)
	w.currencies = append(w.currencies, c.Currency)
	w.statuses = append(w.statuses, string(c.Status))
	w.failures = append(w.failures, c.FailureCode)
	w.descriptions = append(w.descriptions, c.Description)
	w.metadata = append(w.metadata, metadata)
	w.eventIDs = append(w.eventIDs, payment.NewID())
	w.eventTypes = append(w.eventTypes, eventType)
	w.payloads = append(w.payloads, payload)
	return nil
}

func (w *chargeWrites) addKey(req idempotency.Request, resp idempotency.Response) {
	body, encoding := encodeBody(resp.Body)
	var location *string
	if resp.Location != "" {
		location = &resp.Location
	}
	w.keyMerchants = append(w.keyMerchants, req.MerchantID)
	w.keys = append(w.keys, req.Key)
	w.fingerprints = append(w.fingerprints, req.Fingerprint[:])
	w.keyStatuses = append(w.keyStatuses, int16(resp.Status))
	w.locations = append(w.locations, location)
	w.bodies = append(w.bodies, body)
	w.bodyEncodings = append(w.bodyEncodings, encoding)
}

func (w *chargeWrites) args() []any {
	return []any{
		pgUUIDs(w.debitMerchants), pgUUIDs(w.debitAccounts), w.debitAmounts,
		pgUUIDs(w.chargeMerchants), pgUUIDs(w.chargeIDs), pgUUIDs(w.chargeAccounts), w.chargeAmounts, w.currencies, w.statuses, w.failures,
		w.descriptions, w.metadata,
		pgUUIDs(w.eventIDs), w.eventTypes, w.payloads,
		pgUUIDs(w.keyMerchants), w.keys, w.fingerprints, w.keyStatuses, w.locations, w.bodies, w.bodyEncodings,
	}
}

// pgUUIDs gives ids the driver's own uuid type, which it sends as 16 bytes;
// a uuid.UUID goes as text through database/sql's Valuer, and the batch's
// arrays made that a fifth of the service's CPU.
func pgUUIDs(ids []uuid.UUID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = pgUUID(id)
	}
	return out
}

func pgUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// rollback ends a transaction that failed part way; a connection that cannot
// even do that is closed, so the pool never hands out one in a transaction.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}
