// Package charging is the charge use case: every charge, whatever its
// outcome, is decided here, in batches gathered by internal/groupcommit,
// with the retries, the splits, the waits of the members that leave a batch,
// and the report of charges whose clients left. Its database is a port it
// declares (chargedb.Store), which internal/postgres implements with SQL;
// the decisions are plain Go (decide.go).
package charging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/groupcommit"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// The charge path. Every charge, whatever its outcome, goes through chargeTx,
// which runs a batch of charges (one, or many gathered by internal/groupcommit)
// in one transaction and one commit, through the port chargedb.Store (its SQL
// is internal/postgres's chargesql.go and chargewrite.go). A batch waits for no lock that another
// transaction holds, so no member ever waits, or fails, for another's reason:
//
//  1. One round trip: BEGIN; the advisory lock of every member's key, taken
//     without waiting; the stored responses of those keys; the accounts of the
//     members whose keys this batch holds and are not stored, locked FOR
//     UPDATE SKIP LOCKED in (merchant_id, id) order. Only when an account did
//     not come back, one more round trip tells an unknown account from one
//     another transaction holds (chargedb.Store.Lock).
//  2. In Go, member by member in order: a member whose key another
//     transaction holds leaves the batch, its account untouched (it then
//     waits for the key alone, holding nothing: wait.go); a stored key
//     is replayed (or refused as reused) without touching accounts or
//     charges; a key already seen in this batch answers from its first
//     member (or leaves with it); a member whose account row another
//     transaction holds leaves the batch with its account's other members
//     (they wait for the row together, wait.go); every other member is
//     decided by payment.ChargeAccount against what the members before it
//     left available (the balance less the live holds, which the same round
//     trip read once the accounts were locked), and its answer rendered
//     (decideBatch, decide.go: plain Go). An authorization adds to its
//     account's holds instead of taking from its balance.
//  3. One round trip: expired keys deleted, balances and holds, charges
//     (succeeded, failed and authorized), events and key rows with their responses written by one
//     statement over arrays, and COMMIT (chargedb.Tx.Commit).
//
// A batch whose accounts this process charged last (all in its book, none
// with holds) skips step 1: it is decided ahead against the book by the same
// step 2, and one round trip takes the same locks, checks that every premise
// of those decisions holds, writes and commits, or writes nothing and the
// batch runs as above (ahead.go).
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
// starts their retention when the responses are stored. A batch decided
// ahead carries the database's clock as this process reads it (ahead.go,
// dbClock) instead, which the database takes only
// when it lies between a second before the transaction began and the moment
// of its check, so anything that follows the charge reads a later clock.
//
// Lock order, everywhere in the service: an idempotency key's advisory lock
// (waited for only by a transaction that holds nothing yet), then accounts in
// (merchant_id, id) order, then charges, then the key's row. A key's
// advisory lock is held by whichever transaction writes that key's row, so a
// batch never waits on a key's index entry while it holds accounts. Only
// transactions that hold no account wait for an account: a busy group (which
// holds its members' keys), a charge alone (its own key), and a refund, a
// capture or a void (its own key, then its charge's one account), each
// bounded by IDEMPOTENCY_WAIT; the one exception is the expiry sweep
// (postgres.Holds), which takes its accounts in order, waiting, and which
// no other transaction waits for while holding one. A card charge
// (internal/cards) has no account: the transition of its operation at the
// processor takes the key's advisory lock, then the operation, its charge,
// and the key's row.

// Options tune a Path. Zero values take the defaults.
type Options struct {
	// BatchSize is the most charges committed together (default 64);
	// Batches how many such batches may be in flight at once (default 1).
	// See internal/groupcommit.
	BatchSize int
	Batches   int
	// KeyWait (IDEMPOTENCY_WAIT, default 5s) bounds a charge's wait in the
	// queue for a batch, and a member's wait, after its batch, for a key in
	// flight or a locked account.
	KeyWait time.Duration
	// CommitWait (COMMIT_WAIT, default 5s) is the store's bound on a
	// commit's wait for the synchronous standby; with KeyWait it says when a
	// batch is stuck (StuckAfter).
	CommitWait time.Duration
	// Waiters is how many charges may wait outside a batch at once, each
	// holding a pooled connection (wait.go): half the pool (default 10, half
	// of the store's default 20).
	Waiters int
	// AuthorizationTTL (CHARGE_AUTHORIZATION_TTL, default 7 days) is how
	// long an authorization holds its amount unless captured or voided.
	AuthorizationTTL time.Duration
	// OnAbandoned, if set, is told what became of each charge whose client
	// left while it was queued or being decided (wait.go). It may run on any
	// goroutine, after the client was answered.
	OnAbandoned func(AbandonedCharge)
}

func (o Options) withDefaults() Options {
	if o.KeyWait <= 0 {
		o.KeyWait = 5 * time.Second
	}
	if o.CommitWait <= 0 {
		o.CommitWait = 5 * time.Second
	}
	if o.Waiters <= 0 {
		o.Waiters = 10
	}
	if o.AuthorizationTTL <= 0 {
		o.AuthorizationTTL = DefaultAuthorizationTTL
	}
	return o
}

// DefaultAuthorizationTTL is how long an authorization holds its amount by
// default: 7 days, as card networks commonly allow.
const DefaultAuthorizationTTL = 7 * 24 * time.Hour

// Path is the charge path: group-committed batches of charges over db.
type Path struct {
	db      chargedb.Store
	opts    Options
	charges *groupcommit.Batcher[chargedb.KeyedCharge, chargeAnswer]
	// waiters holds a token for each charge waiting outside a batch for a
	// key in flight or a locked account (wait.go): at most Options.Waiters.
	waiters chan struct{}
	// book records accounts as this process's batches left them, to decide
	// batches ahead, and clock reads the database's clock for them
	// (ahead.go).
	book  book
	clock dbClock
}

// New returns the charge path over db; its batcher starts at once.
func New(db chargedb.Store, opts Options) *Path {
	opts = opts.withDefaults()
	s := &Path{db: db, opts: opts, waiters: make(chan struct{}, opts.Waiters)}
	s.charges = s.newChargeBatcher(s.runBatch)
	return s
}

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
func (s *Path) CreateCharge(ctx context.Context, req chargedb.KeyedCharge) (idempotency.Result, error) {
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
		return idempotency.Result{}, err
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
func (s *Path) newChargeBatcher(run groupcommit.Run[chargedb.KeyedCharge, chargeAnswer]) *groupcommit.Batcher[chargedb.KeyedCharge, chargeAnswer] {
	return groupcommit.New(context.Background(), run, groupcommit.Options[chargedb.KeyedCharge, chargeAnswer]{
		MaxSize:     s.opts.BatchSize,
		Concurrency: s.opts.Batches,
		MaxWait:     s.opts.KeyWait,
		Abandoned:   s.reportAbandoned,
	})
}

// Stats describes the charge batcher at this moment, for metrics.
func (s *Path) Stats() groupcommit.Stats { return s.charges.Stats() }

// StuckAfter is the age past which a charge batch is stuck: every wait of a
// batch ends within KeyWait (IDEMPOTENCY_WAIT), and its commit's wait for the
// standby within CommitWait (COMMIT_WAIT).
func (s *Path) StuckAfter() time.Duration { return s.opts.KeyWait + s.opts.CommitWait }

// Moving returns payment.ErrUnavailable while a charge batch has run longer
// than StuckAfter: charges are not being decided in this process.
func (s *Path) Moving() error {
	if age := s.charges.Stats().BatchAge; age > s.StuckAfter() {
		return fmt.Errorf("%w: the charge path is stuck: a batch has run for %s, past IDEMPOTENCY_WAIT + COMMIT_WAIT (%s)",
			payment.ErrUnavailable, age.Round(time.Millisecond), s.StuckAfter())
	}
	return nil
}

// Ready reports whether this process can serve charges: its charge path
// makes progress (Moving) and the database answers as a primary
// (chargedb.Store.Ping). It returns payment.ErrUnavailable, saying why, when
// not.
func (s *Path) Ready(ctx context.Context) error {
	if err := s.Moving(); err != nil {
		return err
	}
	return s.db.Ping(ctx)
}

// runBatch runs one group-committed batch. Its members that left (a key in
// flight, an account locked elsewhere) get their deadline, and the busy ones
// their groups, which start waiting at once on goroutines of their own: the
// batcher goes on with the next batch.
func (s *Path) runBatch(ctx context.Context, reqs []chargedb.KeyedCharge) ([]chargeAnswer, error) {
	// Every wait of a batch is bounded (it waits for no lock held
	// elsewhere, and the commit has CommitWait of its own); this is the
	// backstop.
	ctx, cancel := context.WithTimeout(ctx, s.opts.KeyWait)
	defer cancel()
	answers, err := s.chargeBatch(ctx, reqs, chargedb.Waits{})
	if err != nil {
		return nil, err
	}
	s.formBusyGroups(reqs, answers, time.Now().Add(s.opts.KeyWait))
	return answers, nil
}

// chargeAlone runs req as a transaction of its own that waits (until
// deadline) for the transaction holding its key, and then for its account,
// holding nothing but its own key while it waits.
func (s *Path) chargeAlone(ctx context.Context, req chargedb.KeyedCharge, deadline time.Time) (idempotency.Result, error) {
	release, err := s.startWaiting(ctx, deadline)
	if err != nil {
		return idempotency.Result{}, err
	}
	defer release()
	answers, err := s.chargeBatch(ctx, []chargedb.KeyedCharge{req}, chargedb.Waits{Key: true, Accounts: true, Deadline: deadline})
	if err != nil {
		return idempotency.Result{}, err
	}
	return answers[0].res, answers[0].err
}

// maxAttempts bounds how often a batch that hit a deadlock, a
// serialization failure or a key row that appeared under it runs again.
const maxAttempts = 3

// chargeBatch runs reqs in one transaction (chargeTx), again after a
// deadlock, a serialization failure or a key row that appeared under it
// (chargedb.ErrConflict, chargedb.ErrDuplicate), up to maxAttempts times.
// Any other failure while the database is there belongs to some member (a
// statement of its own failed): the batch is split in two and each half runs
// on its own, down to that member, so that it alone gets the error and
// everyone else the answer they would have had alone.
func (s *Path) chargeBatch(ctx context.Context, reqs []chargedb.KeyedCharge, mode chargedb.Waits) ([]chargeAnswer, error) {
	var err error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		var answers []chargeAnswer
		if answers, err = s.chargeTx(ctx, reqs, mode); err == nil {
			return answers, nil
		}
		if !errors.Is(err, chargedb.ErrConflict) && !errors.Is(err, chargedb.ErrDuplicate) {
			break
		}
	}
	if len(reqs) == 1 || errors.Is(err, chargedb.ErrConflict) || errors.Is(err, payment.ErrUnavailable) ||
		errors.Is(err, idempotency.ErrKeyInUse) || ctx.Err() != nil {
		return nil, err // the batch's fate, not one member's
	}
	half := len(reqs) / 2
	answers := make([]chargeAnswer, 0, len(reqs))
	for _, part := range [][]chargedb.KeyedCharge{reqs[:half], reqs[half:]} {
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

// chargeTx runs one batch in one transaction (see the top of this file): its
// locks and reads (chargedb.Store.Lock), its decisions member by member
// (decideBatch), and its writes and commit (chargedb.Tx.Commit). The
// transaction ends with it, whatever happens in between: Close rolls back
// what did not commit.
func (s *Path) chargeTx(ctx context.Context, reqs []chargedb.KeyedCharge, mode chargedb.Waits) ([]chargeAnswer, error) {
	if mode == (chargedb.Waits{}) {
		if answers, ok, err := s.chargeAhead(ctx, reqs); ok || err != nil {
			return answers, err
		}
	}
	sent := s.clock.local()
	tx, locks, err := s.db.Lock(ctx, reqs, mode)
	if err != nil {
		return nil, err
	}
	defer tx.Close()
	s.clock.saw(locks.Now, sent)
	answers, decided, w := decideBatch(reqs, locks, s.opts.AuthorizationTTL)
	storedAt, err := tx.Commit(ctx, &w.Writes)
	if err != nil {
		s.book.forget(reqs)
		return nil, err
	}
	s.book.put(locks.Accounts) // as the batch left them
	for i := range answers {
		if decided[i] && answers[i].err == nil {
			answers[i].res.StoredAt = storedAt
		}
	}
	return answers, nil
}
