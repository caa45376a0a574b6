package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

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

// waits is what a chargeTx may wait for, until deadline: nothing (a batch),
// its members' account rows (a busy group), or also its one member's key
// (chargeAlone).
type waits struct {
	key, accounts bool
	deadline      time.Time
}

// chargeTx runs one batch in one transaction (see the top of this file): its
// locks and reads (lockBatch), its decisions member by member (decideBatch),
// and its writes and commit (writeBatch). It reports how many events it
// wrote.
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
	locks, err := s.lockBatch(ctx, conn, reqs, mode)
	if err != nil {
		return nil, 0, err
	}
	answers, decided, w := decideBatch(reqs, locks)
	storedAt, err := s.writeBatch(ctx, conn, w)
	if err != nil {
		return nil, 0, err
	}
	for i := range answers {
		if decided[i] && answers[i].err == nil {
			answers[i].res.StoredAt = storedAt
		}
	}
	return answers, len(w.charges), nil
}

// decideBatch answers a batch's members in order from what lockBatch found,
// and gathers what the batch writes. decided[i] tells a member answered by
// this batch's execution from one answered by a stored row or that left.
func decideBatch(reqs []idempotency.ChargeRequest, locks batchLocks) (answers []chargeAnswer, decided []bool, w *chargeWrites) {
	n := len(reqs)
	answers, decided, w = make([]chargeAnswer, n), make([]bool, n), &chargeWrites{}
	first := make(map[idempotency.Request]int, n) // by (merchant, key): the member that executed it
	for i, r := range reqs {
		id := idempotency.Request{MerchantID: r.Key.MerchantID, Key: r.Key.Key}
		j, seen := first[id]
		switch {
		case !locks.keyHeld[i]:
			answers[i].inFlight = true
		case locks.stored[i].found && !locks.stored[i].expired:
			// An answer from a stored row: confirm it (durable.go).
			w.confirmReplays = true
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
				w.expired = append(w.expired, r.Key)
			}
			answers[i].res, answers[i].err = w.decide(r, locks.accounts, locks.now)
		}
	}
	return answers, decided, w
}

// replayStored answers req from the response stored under its key.
func replayStored(req idempotency.Request, k storedKey) (idempotency.Result, error) {
	if k.resp.Status == 0 || len(k.fingerprint) != len(req.Fingerprint) {
		// Cannot happen: the row and its response commit together.
		return idempotency.Result{}, errors.New("stored idempotency key has no response")
	}
	if k.decodeErr != nil {
		return idempotency.Result{}, k.decodeErr
	}
	res, err := idempotency.Replay(req, idempotency.Fingerprint(k.fingerprint), k.resp)
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

// chargeWrites is what a batch writes, in its members' order: keys found
// expired (deleted first), the debits (one per account), the charges with
// their events, and every decided key with its response.
type chargeWrites struct {
	expired    []idempotency.Request
	debits     []debit
	debitIndex map[accountKey]int // by account: its place in debits
	charges    []chargeRow
	keys       []keyRow
	// confirmReplays: some answer comes from a stored row, so the commit
	// waits for the standby to confirm it (durable.go).
	confirmReplays bool
}

type debit struct {
	account accountKey
	amount  int64
}

// chargeRow is a charge to insert, with its event.
type chargeRow struct {
	merchant  uuid.UUID
	charge    payment.Charge
	eventID   uuid.UUID
	eventType string
	payload   []byte // the charge's public JSON: the event's data
}

// keyRow is a decided key and the response to store under it.
type keyRow struct {
	req  idempotency.Request
	resp idempotency.Response
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
		w.addCharge(r.Key.MerchantID, c, payload)
		if c.Status == payment.ChargeSucceeded {
			w.debit(ak, c.Amount)
		}
	}
	w.keys = append(w.keys, keyRow{req: r.Key, resp: resp})
	return idempotency.Result{Response: resp}, nil
}

func (w *chargeWrites) debit(ak accountKey, amount int64) {
	if w.debitIndex == nil {
		w.debitIndex = make(map[accountKey]int)
	}
	if i, ok := w.debitIndex[ak]; ok {
		w.debits[i].amount += amount
		return
	}
	w.debitIndex[ak] = len(w.debits)
	w.debits = append(w.debits, debit{account: ak, amount: amount})
}

func (w *chargeWrites) addCharge(merchant uuid.UUID, c payment.Charge, payload []byte) {
	eventType := payment.EventChargeSucceeded
	if c.Status == payment.ChargeFailed {
		eventType = payment.EventChargeFailed
	}
	w.charges = append(w.charges, chargeRow{merchant: merchant, charge: c, eventID: payment.NewID(), eventType: eventType, payload: payload})
}
