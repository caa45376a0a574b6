// Package chargedb is the boundary between the charge use case
// (internal/charging) and the database that keeps its rows, as river's
// riverdriver is between river and its drivers: the use case declares here
// what it needs, in plain types, and internal/postgres implements it with
// SQL. Nothing here decides anything; the decisions are internal/charging's.
//
// A batch of charges is one transaction and two round trips: Lock (BEGIN,
// the members' keys, their stored responses and their accounts, locked) and
// Tx.Commit (what the use case decided, written, and COMMIT); or, for a batch
// the use case decided ahead against its record of the accounts, one round
// trip: CommitAhead (the record checked under the same locks, the writes, the
// commit).
package chargedb

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// Store is the database side of the charge path.
type Store interface {
	// Lock begins a transaction for reqs and runs its first round trip: the
	// advisory lock of every member's key (waiting for none but, with
	// w.Key, the one member's), the responses stored under those keys, and
	// the accounts of the members whose keys it holds and are not stored,
	// locked FOR UPDATE in (merchant_id, id) order, skipping those another
	// transaction holds unless w.Accounts. Those skipped are Locks.Busy.
	// On error the transaction is over and Tx is nil.
	Lock(ctx context.Context, reqs []KeyedCharge, w Waits) (Tx, *Locks, error)
	// CommitAhead runs a batch decided ahead in one transaction and one
	// round trip, on no request's context and confirmed by the synchronous
	// standby, if any: it writes w and commits only if it takes every
	// member's key lock and every account of e's row, not waiting for
	// another transaction to end, no key is stored, each account is as e
	// says with no holds, and e.At is a clock the database can own (not
	// after the check, not more than a second before the transaction
	// began). When any of that does not hold it writes nothing and returns
	// ErrNotAsExpected. It returns when the keys' responses were stored.
	CommitAhead(ctx context.Context, reqs []KeyedCharge, e Expected, w *Writes) (storedAt time.Time, err error)
	// Ping checks that the database answers and takes writes; it returns
	// payment.ErrUnavailable when it does not.
	Ping(ctx context.Context) error
}

// Tx is a batch's transaction after Lock.
type Tx interface {
	// Commit writes w and commits, on no request's context and confirmed by
	// the synchronous standby, if any. It returns when the keys' responses
	// were stored, if any were. After a commit that wrote events, the store
	// wakes the relay itself.
	Commit(ctx context.Context, w *Writes) (storedAt time.Time, err error)
	// Close ends the transaction: after Commit it does nothing; without one
	// (an error, a panic in the decision) it rolls back, so a connection is
	// never left inside a transaction. It releases the connection.
	Close()
}

// The errors of Lock and Commit, besides payment.ErrUnavailable (the
// database is not there, a connection or a lock wait past its bound) and
// idempotency.ErrKeyInUse (with Waits.Key: the key stayed held for the whole
// bound). Any other error is a statement's own: a member's, or the batch's.
var (
	// ErrConflict is a deadlock or a serialization failure: the whole
	// transaction may simply run again, and if it keeps failing, it is the
	// batch's fate, not one member's.
	ErrConflict = errors.New("chargedb: deadlock or serialization failure")
	// ErrDuplicate is a key row that appeared under the transaction (a
	// unique violation): it may run again; if it keeps failing, it is some
	// member's.
	ErrDuplicate = errors.New("chargedb: a row appeared under the transaction")
	// ErrNotAsExpected is CommitAhead's refusal: a key was in flight or
	// stored, an account was locked elsewhere, missing or not as expected,
	// or the clock was off. Nothing was written.
	ErrNotAsExpected = errors.New("chargedb: the batch's keys or accounts are not as it was decided against")
)

// Expected is what a batch decided ahead was decided against: its clock
// (the created_at of its charges) and its accounts as they stood before it,
// each with no holds.
type Expected struct {
	At       time.Time
	Accounts []payment.Account
}

// Waits is what a batch's transaction may wait for, until Deadline: nothing
// (a batch), its members' account rows (Accounts: a busy group), or also its
// one member's key (Key: a charge alone).
type Waits struct {
	Key, Accounts bool
	Deadline      time.Time
}

// AccountKey names an account.
type AccountKey struct{ Merchant, ID uuid.UUID }

// Locks is what a batch's first round trip found.
type Locks struct {
	KeyHeld  []bool                          // by member: this transaction holds its key's lock
	Stored   []StoredKey                     // by member: the row stored under its key
	Now      time.Time                       // the transaction's clock
	Accounts map[AccountKey]*payment.Account // locked here, with their live holds (Held) as of Now
	Busy     map[AccountKey]bool             // locked by another transaction
}

// StoredKey is what was found under one member's key.
type StoredKey struct {
	Found, Expired bool
	Fingerprint    []byte
	// Resp is the stored response, its body decoded; its Status is 0 only
	// for a row without a response, which cannot be (the row and its
	// response commit together).
	Resp      idempotency.Response
	DecodeErr error // the stored body could not be decoded
	StoredAt  time.Time
}

// Writes is what a batch writes, in its members' order: keys found expired
// (deleted first), the debits (one per account), the charges with their
// events, and every decided key with its response.
type Writes struct {
	Expired []idempotency.Request
	Debits  []Debit
	Charges []ChargeRow
	Keys    []KeyRow
	// ConfirmReplays: some answer comes from a stored row, so the commit
	// waits for the standby to confirm it (internal/postgres/durable.go).
	ConfirmReplays bool
}

// Debit is what an account's balance loses (Amount) and what its holds gain
// (Hold: the authorizations of the batch).
type Debit struct {
	Account AccountKey
	Amount  int64
	Hold    int64
}

// ChargeRow is a charge to insert, with its event.
type ChargeRow struct {
	Merchant  uuid.UUID
	Charge    payment.Charge
	EventID   uuid.UUID
	EventType string
	Payload   []byte // the charge's public JSON: the event's data
}

// KeyRow is a decided key and the response to store under it.
type KeyRow struct {
	Req  idempotency.Request
	Resp idempotency.Response
}

// Renderer turns a decided charge into the response stored under its key:
// c is the charge, body its public JSON (also its event's data), and err is
// payment.ErrAccountNotFound or payment.ErrCurrencyMismatch when the charge
// was refused before it existed. An error from it fails the request,
// storing nothing.
type Renderer func(c payment.Charge, body []byte, err error) (idempotency.Response, error)

// KeyedCharge is one charge to execute under its idempotency key.
type KeyedCharge struct {
	Request idempotency.Request
	Charge  payment.NewCharge
	Render  Renderer
}

// Account names the account the charge is on.
func (k KeyedCharge) Account() AccountKey {
	return AccountKey{Merchant: k.Request.MerchantID, ID: k.Charge.AccountID}
}
