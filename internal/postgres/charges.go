package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// in one transaction and one commit:
//
//  1. One round trip: BEGIN; the advisory lock of every member's key, taken
//     without waiting; the stored responses of those keys; the accounts of the
//     members whose keys are not stored, locked FOR UPDATE in (merchant_id,
//     id) order, so batches on several replicas cannot deadlock.
//  2. In Go, member by member in order: a key whose lock another transaction
//     holds leaves the batch (Store.CreateCharge then waits for it alone, holding
//     nothing); a stored key is replayed (or refused as reused) without
//     touching accounts or charges; a key already seen in this batch answers
//     from its first member; every other member is decided by
//     payment.ChargeAccount against the balance the members before it left,
//     and its answer rendered.
//  3. One round trip: expired keys deleted, balances, charges (succeeded and
//     failed), events and key rows with their responses written by one
//     statement over arrays, and COMMIT.
//
// The clock is the database's: every row and every rendered created_at of a
// batch is the transaction's now(), except the key rows' created_at, which
// starts their retention when the responses are stored.
//
// Lock order, everywhere in the service: an idempotency key's advisory lock
// (the only lock anything waits for while holding none), then accounts in
// (merchant_id, id) order, then charges, then the key's row. A key's advisory
// lock is held by whichever transaction writes that key's row, so a batch never
// waits on a key's index entry while it holds accounts.

// chargeAnswer is a batch's answer for one member.
type chargeAnswer struct {
	res      idempotency.Result
	err      error
	inFlight bool // another transaction holds the key: wait for it alone
}

// CreateCharge executes req at most once per (merchant, key), in a batch with the
// charges running concurrently in this process. Its result is req's rendered
// response, or the replay of the one stored under the key; the errors are
// those of Idempotent.
func (s *ChargePath) CreateCharge(ctx context.Context, req idempotency.ChargeRequest) (idempotency.Result, error) {
	ans, err := s.charges.Do(ctx, req)
	switch {
	case err != nil:
		return idempotency.Result{}, asUnavailable(err)
	case ans.inFlight:
		return s.chargeAlone(ctx, req)
	}
	return ans.res, ans.err
}

// chargeAlone runs req as a batch of one that waits (up to KeyWait) for the
// transaction holding its key, holding nothing itself while it waits.
func (s *ChargePath) chargeAlone(ctx context.Context, req idempotency.ChargeRequest) (idempotency.Result, error) {
	answers, err := s.chargeBatch(ctx, []idempotency.ChargeRequest{req}, true)
	if err != nil {
		return idempotency.Result{}, err
	}
	return answers[0].res, answers[0].err
}

// newChargeBatcher is the group commit of charges. A batch runs on no
// request's context (one client going away must not abort its neighbours), so
// it gets its own bound: every lock it may wait for is bounded by KeyWait.
func (s *ChargePath) newChargeBatcher() *groupcommit.Batcher[idempotency.ChargeRequest, chargeAnswer] {
	return groupcommit.New(context.Background(), func(ctx context.Context, reqs []idempotency.ChargeRequest) ([]chargeAnswer, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*s.opts.KeyWait)
		defer cancel()
		return s.chargeBatch(ctx, reqs, false)
	}, groupcommit.Options{MaxSize: s.opts.ChargeBatchSize, Concurrency: s.opts.ChargeBatches})
}

// chargeBatch runs chargeTx, again after a deadlock, a serialization failure or
// a key row that appeared under it, up to maxAttempts times.
func (s *ChargePath) chargeBatch(ctx context.Context, reqs []idempotency.ChargeRequest, wait bool) ([]chargeAnswer, error) {
	for attempt := 1; ; attempt++ {
		answers, events, err := s.chargeTx(ctx, reqs, wait)
		if err == nil {
			if events > 0 {
				s.eventsCommitted()
			}
			return answers, nil
		}
		if (retryable(err) || hasCode(err, codeUniqueViolation)) && attempt < maxAttempts {
			continue
		}
		return nil, asUnavailable(err)
	}
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
	// holds it. Keys are hashed with their merchant (a uuid's text has a fixed
	// length, so the concatenation is unambiguous); two keys sharing a hash
	// only make one of them wait for the other.
	tryLockKeysSQL = `
SELECT pg_try_advisory_xact_lock(hashtextextended(m::text || k, 0))
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS u(m, k, i)
ORDER BY i`

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

	// lockAccountsSQL locks the accounts of the members whose keys are not
	// stored (or have expired), in a fixed order.
	lockAccountsSQL = `
SELECT a.merchant_id, a.id, a.currency, a.balance
FROM accounts a
WHERE (a.merchant_id, a.id) IN (
    SELECT u.m, u.a FROM unnest($1::uuid[], $2::text[], $3::uuid[]) AS u(m, k, a)
    WHERE NOT EXISTS (
        SELECT FROM idempotency_keys ik
        WHERE ik.merchant_id = u.m AND ik.key = u.k AND ik.created_at >= now() - $4::interval))
ORDER BY a.merchant_id, a.id
FOR UPDATE OF a`

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

// chargeTx runs one batch in one transaction (see the top of this file). With
// wait, the keys' locks are waited for, as chargeAlone needs. It reports how
// many events it wrote.
func (s *ChargePath) chargeTx(ctx context.Context, reqs []idempotency.ChargeRequest, wait bool) (answers []chargeAnswer, events int, err error) {
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
	if wait {
		b.Queue(lockKeySQL, merchants[0], keys[0])
	} else {
		b.Queue(s.chargeSQL.tryLockKeys, merchants, keys)
	}
	b.Queue(s.chargeSQL.lookupKeys, merchants, keys, s.opts.KeyTTL)
	b.Queue(s.chargeSQL.lockAccounts, merchants, keys, accountIDs, s.opts.KeyTTL)
	br := conn.SendBatch(ctx, b)
	locked, stored, now, accounts, err := readLocks(br, n, wait)
	if closeErr := br.Close(); err == nil {
		err = closeErr
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
		switch j, seen := first[id]; {
		case !locked[i]:
			answers[i].inFlight = true
		case stored[i].found && !stored[i].expired:
			replayed = true
			answers[i].res, answers[i].err = replayStored(r.Key, stored[i])
		case seen: // j's answer is final: it was decided above
			answers[i] = sameKey(r.Key, reqs[j].Key, answers[j])
			decided[i] = true
		default:
			first[id] = i
			decided[i] = true
			if stored[i].found {
				w.deleteExpired(r.Key)
			}
			answers[i].res, answers[i].err = w.decide(r, accounts, now)
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

// readLocks reads the answers of round trip 1.
func readLocks(br pgx.BatchResults, n int, wait bool) (locked []bool, stored []keyRow, now time.Time, accounts map[accountKey]*payment.Account, err error) {
	for range 2 { // BEGIN, planSQL
		if _, err = br.Exec(); err != nil {
			return nil, nil, now, nil, fmt.Errorf("begin: %w", err)
		}
	}
	locked = make([]bool, n)
	if wait {
		if _, err = br.Exec(); err != nil {
			if hasCode(err, codeLockNotAvailable) {
				err = idempotency.ErrKeyInUse // the twin is still in flight after the whole bound
			}
			return nil, nil, now, nil, err
		}
		locked[0] = true
	} else {
		rows, _ := br.Query()
		for i := 0; rows.Next(); i++ {
			if err = rows.Scan(&locked[i]); err != nil {
				break
			}
		}
		rows.Close()
		if err = rows.Err(); err != nil {
			return nil, nil, now, nil, fmt.Errorf("lock keys: %w", err)
		}
	}

	stored = make([]keyRow, n)
	rows, _ := br.Query()
	for rows.Next() {
		var (
			i         int64
			k         keyRow
			createdAt *time.Time
			expired   *bool
		)
		if err = rows.Scan(&i, &now, &k.fingerprint, &k.status, &k.resp.Location, &k.resp.Body, &k.encoding, &createdAt, &expired); err != nil {
			break
		}
		if createdAt != nil {
			k.found, k.storedAt, k.expired = true, *createdAt, *expired
		}
		stored[i-1] = k
	}
	rows.Close()
	if err = rows.Err(); err != nil {
		return nil, nil, now, nil, fmt.Errorf("look up keys: %w", err)
	}

	accounts = make(map[accountKey]*payment.Account)
	rows, _ = br.Query()
	for rows.Next() {
		a := &payment.Account{}
		if err = rows.Scan(&a.MerchantID, &a.ID, &a.Currency, &a.Balance); err != nil {
			break
		}
		accounts[accountKey{a.MerchantID, a.ID}] = a
	}
	rows.Close()
	if err = rows.Err(); err != nil {
		return nil, nil, now, nil, fmt.Errorf("lock accounts: %w", err)
	}
	return locked, stored, now, accounts, nil
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
