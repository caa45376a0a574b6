package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// The keyed write: the one algorithm by which a write runs under a key,
// over the store's port (Store, Tx), which answers statements and runs
// nothing of its caller's. In one transaction it claims the key (its lock,
// then its unique row), runs the step, and leaves the step's answer under
// the key; or it finds the key already used and answers from it: the stored
// response (a replay), a refusal of another request under the same key, or
// the operation the key is bound to. A key found expired is deleted and
// claimed afresh. A deadlock or a serialization failure runs the whole
// transaction again; any other failure rolls it back, key included, so a
// retry starts clean.
//
// An answer has one of two shapes. Most steps end in their transaction: the
// response is stored with the key. A step that starts an operation going on
// after the transaction (a charge at a card processor, whose call cannot be
// inside it) binds the key to that operation instead: the key answers
// "in progress, see this operation" until the operation ends, in a later
// transaction of its own, and stores the key's response with its outcome
// (the operation's store does so; see Tx.Bind). Its retries never start it
// again.
//
// The charge path (internal/charging) has a third shape, many keys in one
// transaction, over its own port (internal/charging/chargedb); the contract
// is the same.

// Tx is a store transaction as a keyed write uses it: the statements on the
// key's row, and Work, the statements of the work done under the key. Its
// errors are the store's, with ErrConflict for a deadlock or a
// serialization failure and ErrKeyInUse for a key whose lock stayed held.
type Tx[W any] interface {
	// Claim takes the key's lock, waiting up to the store's bound for a
	// transaction that holds it (ErrKeyInUse past it), and inserts the key's
	// row with req's fingerprint. It reports false when a committed row is
	// already there.
	Claim(ctx context.Context, req Request) (bool, error)
	// Lookup reads the row under req's key; Stored.Expired is set when it
	// is older than ttl.
	Lookup(ctx context.Context, req Request, ttl time.Duration) (Stored, error)
	// DeleteExpired deletes the key's row, found expired.
	DeleteExpired(ctx context.Context, req Request, ttl time.Duration) error
	// Store stores resp under the claimed key and starts the key's
	// retention, returning when it starts.
	Store(ctx context.Context, req Request, resp Response) (time.Time, error)
	// Bind binds the claimed key to op, an operation that goes on after
	// the transaction; the operation's own store writes the key's response
	// when the operation ends.
	Bind(ctx context.Context, req Request, op uuid.UUID) error
	// Confirm returns once what the transaction read is on the synchronous
	// standby, if any: a stored response is answered only then.
	Confirm(ctx context.Context) error
	// Work is the statements of the work done under the key, in this
	// transaction; WorkError turns an error of theirs into the store's
	// (ErrConflict for a deadlock or a serialization failure).
	Work() W
	WorkError(err error) error
	// Commit commits, confirmed by the synchronous standby, if any.
	Commit(ctx context.Context) error
	// Close ends the transaction, rolling it back unless it was committed,
	// and releases its connection.
	Close()
}

// Store begins the transactions of keyed writes.
type Store[W any] interface {
	BeginKeyed(ctx context.Context) (Tx[W], error)
}

// Stored is what Tx.Lookup found under a key.
type Stored struct {
	Found, Expired bool
	Fingerprint    []byte
	// Response is the stored response; its Status is 0 while the key is
	// bound to Operation, still going on.
	Response  Response
	Operation uuid.UUID
	StoredAt  time.Time
}

// ErrConflict is a deadlock or a serialization failure: the store reports it
// so that the whole transaction runs again.
var ErrConflict = errors.New("idempotency: deadlock or serialization failure")

// Step is the work done under a freshly claimed key, in the transaction that
// claimed it. A business refusal that must be replayed is an Answer (a
// stored 404, say), not an error; an error rolls everything back, key
// included.
type Step[W any] func(ctx context.Context, w W) (Answer, error)

// Answer is what a step leaves under its key: its Response, stored now; or,
// when Operation is set, the key bound to that operation, which goes on
// after the transaction and stores the key's response when it ends.
type Answer struct {
	Response
	Operation uuid.UUID
}

// Respond is a Step that always answers with a response stored now: it
// adapts work that ends in its transaction.
func Respond[W any](work func(ctx context.Context, w W) (Response, error)) Step[W] {
	return func(ctx context.Context, w W) (Answer, error) {
		resp, err := work(ctx, w)
		return Answer{Response: resp}, err
	}
}

// Keys runs keyed writes over a store.
type Keys[W any] struct {
	store     Store[W]
	ttl       time.Duration
	onExpired func()
}

// KeysOptions tune Keys.
type KeysOptions struct {
	// TTL is how long a stored response is kept (default 24h): a key found
	// older is deleted and claimed afresh.
	TTL time.Duration
	// OnExpired, if set, is called when a request finds its key expired.
	OnExpired func()
}

// maxAttempts bounds how often a keyed write that hit a deadlock or a
// serialization failure is run again.
const maxAttempts = 3

// NewKeys returns the keyed writes over store.
func NewKeys[W any](store Store[W], o KeysOptions) *Keys[W] {
	if o.TTL <= 0 {
		o.TTL = 24 * time.Hour
	}
	return &Keys[W]{store: store, ttl: o.TTL, onExpired: o.OnExpired}
}

// Idempotent runs step at most once per (merchant, key) and returns the answer: the
// step's own response, or, when the key is already used, the stored
// response as a replay, or ErrKeyReused when req's fingerprint differs. When
// the key is bound to an operation still going on (begun by this request's
// step, or by an earlier request's), Result.Operation names it and
// Result.Status is 0: the caller answers from the operation. Errors are the
// store's (ErrKeyInUse: another request held the key past the store's
// bound).
func (k *Keys[W]) Idempotent(ctx context.Context, req Request, step Step[W]) (Result, error) {
	for attempt := 1; ; attempt++ {
		res, err := k.once(ctx, req, step)
		if errors.Is(err, ErrConflict) && attempt < maxAttempts {
			continue
		}
		return res, err
	}
}

func (k *Keys[W]) once(ctx context.Context, req Request, step Step[W]) (Result, error) {
	tx, err := k.store.BeginKeyed(ctx)
	if err != nil {
		return Result{}, err
	}
	defer tx.Close()
	// Twice at most: a key found expired is deleted and claimed afresh.
	for range 2 {
		claimed, err := tx.Claim(ctx, req)
		if err != nil {
			return Result{}, err
		}
		if claimed {
			return k.run(ctx, tx, req, step)
		}
		res, found, err := k.replay(ctx, tx, req)
		if err != nil {
			return Result{}, err
		}
		if found {
			// The commit is what waits for the standby (Tx.Confirm).
			return res, tx.Commit(ctx)
		}
	}
	return Result{}, errors.New("idempotency key vanished twice while being claimed")
}

// run runs step under the key tx just claimed, leaves its answer under the
// key, and commits.
func (k *Keys[W]) run(ctx context.Context, tx Tx[W], req Request, step Step[W]) (Result, error) {
	ans, err := step(ctx, tx.Work())
	if err != nil {
		return Result{}, tx.WorkError(err)
	}
	var res Result
	if ans.Operation != uuid.Nil {
		if err := tx.Bind(ctx, req, ans.Operation); err != nil {
			return Result{}, err
		}
		res.Operation = ans.Operation
	} else {
		if res.StoredAt, err = tx.Store(ctx, req, ans.Response); err != nil {
			return Result{}, err
		}
		res.Response = ans.Response
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, err
	}
	return res, nil
}

// replay answers req from what is under its key, committed. It reports
// found=false when there is nothing to answer from: the row went away after
// the claim saw it (the janitor), or it has expired (and is now deleted), so
// the caller claims the key afresh.
func (k *Keys[W]) replay(ctx context.Context, tx Tx[W], req Request) (res Result, found bool, err error) {
	st, err := tx.Lookup(ctx, req, k.ttl)
	switch {
	case err != nil || !st.Found:
		return Result{}, false, err
	case st.Expired:
		if err := tx.DeleteExpired(ctx, req, k.ttl); err != nil {
			return Result{}, false, err
		}
		if k.onExpired != nil {
			k.onExpired()
		}
		return Result{}, false, nil
	case len(st.Fingerprint) != len(req.Fingerprint):
		return Result{}, false, errors.New("stored idempotency key has a malformed fingerprint")
	case st.Response.Status == 0 && st.Operation == uuid.Nil:
		// Cannot happen: a row commits with its response or its operation.
		return Result{}, false, errors.New("stored idempotency key has no response and no operation")
	}
	if Fingerprint(st.Fingerprint) != req.Fingerprint {
		return Result{}, false, ErrKeyReused
	}
	// What the key answers is given only once the standby has it.
	if err := tx.Confirm(ctx); err != nil {
		return Result{}, false, err
	}
	if st.Response.Status == 0 {
		return Result{Operation: st.Operation, Replayed: true}, true, nil
	}
	return Result{Response: st.Response, Replayed: true, StoredAt: st.StoredAt}, true, nil
}
