package charging_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

// A batch is as safe as a lone charge. Each test here failed on the
// batch path before it: one member's locked account, in-flight key, failing
// statement or departed client changed its neighbours' answers.

// clockSlack is how much sooner than IDEMPOTENCY_WAIT a wait may end and
// still count as the whole bound: the lock wait's end is computed by
// PostgreSQL's clock from a bound Go sends in whole milliseconds, and a CI run
// saw one end 3 ms before the Go clock's bound.
const clockSlack = 50 * time.Millisecond

// isolationFixture is a store with KeyWait wait on a database of its own,
// and a second merchant beside chargeFixture's.
type isolationFixture struct {
	s                testkit.Service
	url              string
	merchant, other  uuid.UUID
	abandoned        chan charging.AbandonedCharge
	merchantAccounts map[uuid.UUID]uuid.UUID // account -> merchant
}

func newIsolationFixture(t *testing.T, wait time.Duration) *isolationFixture {
	t.Helper()
	// Registered first, so it runs last: once the store is closed, no busy
	// group or lone wait may be left running.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	f := &isolationFixture{abandoned: make(chan charging.AbandonedCharge, 1000), merchantAccounts: map[uuid.UUID]uuid.UUID{}}
	f.url = pgtest.NewDatabase(t)
	f.s = testkit.OpenService(t, f.url, postgres.Options{KeyWait: wait, CommitWait: 5 * time.Second},
		charging.Options{OnAbandoned: func(a charging.AbandonedCharge) { f.abandoned <- a }})
	var err error
	if err := f.s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.merchant, _, err = f.s.RegisterMerchant(context.Background(), t.Name()); err != nil {
		t.Fatal(err)
	}
	if f.other, _, err = f.s.RegisterMerchant(context.Background(), t.Name()+"-other"); err != nil {
		t.Fatal(err)
	}
	return f
}

// account opens an account of merchant with balance.
func (f *isolationFixture) account(t *testing.T, merchant uuid.UUID, balance int64) uuid.UUID {
	t.Helper()
	id := payment.NewID()
	if _, err := f.s.Pool().Exec(context.Background(), `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, 'USD', $3)`,
		merchant, id, balance); err != nil {
		t.Fatal(err)
	}
	f.merchantAccounts[id] = merchant
	return id
}

func (f *isolationFixture) balance(t *testing.T, account uuid.UUID) int64 {
	t.Helper()
	var b int64
	if err := f.s.Pool().QueryRow(context.Background(), `SELECT balance FROM accounts WHERE id = $1`, account).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// storedKeys counts the stored keys among reqs'.
func (f *isolationFixture) storedKeys(t *testing.T, reqs ...chargedb.KeyedCharge) int {
	t.Helper()
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Request.Key
	}
	var n int
	if err := f.s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = ANY($1)`, keys).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// charge is a charge of amount on account under a fresh key of the
// account's merchant.
func (f *isolationFixture) charge(account uuid.UUID, amount int64) chargedb.KeyedCharge {
	return newCharge(f.merchantAccounts[account], account, amount)
}

// rowHolder is a transaction of the test's own that holds what another
// replica's transaction would, until released or the test ends.
type rowHolder struct {
	tx   pgx.Tx
	conn *pgx.Conn
}

func (f *isolationFixture) hold(t *testing.T) *rowHolder {
	t.Helper()
	conn := testkit.Connect(t, f.url)
	tx, err := conn.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := &rowHolder{tx: tx, conn: conn}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return h
}

// account locks an account's row, as another replica's batch, an operator
// or a commit waiting for the standby does.
func (h *rowHolder) account(t *testing.T, account uuid.UUID) *rowHolder {
	t.Helper()
	if _, err := h.tx.Exec(context.Background(), `SELECT FROM accounts WHERE id = $1 FOR UPDATE`, account); err != nil {
		t.Fatal(err)
	}
	return h
}

// key holds req's key as a twin in flight does: its advisory lock and its
// row, not yet answered.
func (h *rowHolder) key(t *testing.T, req chargedb.KeyedCharge) *rowHolder {
	t.Helper()
	ctx := context.Background()
	if _, err := h.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`, req.Request.MerchantID, req.Request.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := h.tx.Exec(ctx, `INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ($1, $2, $3)`,
		req.Request.MerchantID, req.Request.Key, req.Request.Fingerprint[:]); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *rowHolder) release(t *testing.T) {
	t.Helper()
	if err := h.tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// timedAnswer is a CreateCharge's answer and how long it took.
type timedAnswer struct {
	res  idempotency.Result
	err  error
	took time.Duration
}

// chargeAll runs reqs through CreateCharge at once (released together) and
// returns their answers in order.
func (f *isolationFixture) chargeAll(ctx context.Context, reqs []chargedb.KeyedCharge) []timedAnswer {
	out := make([]timedAnswer, len(reqs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			<-start
			began := time.Now()
			res, err := f.s.CreateCharge(ctx, r)
			out[i] = timedAnswer{res, err, time.Since(began)}
		})
	}
	close(start)
	wg.Wait()
	return out
}

// TestLockedAccountLeavesTheBatch: an account row locked elsewhere makes only
// its own charges leave the batch (Busy); the batch commits the others at
// once, across merchants. Through CreateCharge, the busy charges wait for
// the row (and succeed once it is free), or answer 503 after the bound, while
// every other charge is decided at once.
func TestLockedAccountLeavesTheBatch(t *testing.T) {
	const wait = 2 * time.Second
	ctx := context.Background()
	f := newIsolationFixture(t, wait)
	locked := f.account(t, f.merchant, 10_000)
	free, theirs := f.account(t, f.merchant, 10_000), f.account(t, f.other, 10_000)

	h := f.hold(t).account(t, locked)
	batch := []chargedb.KeyedCharge{f.charge(locked, 100), f.charge(free, 200), f.charge(theirs, 300), f.charge(locked, 400), f.charge(free, 500)}
	began := time.Now()
	got, err := f.s.RunChargeBatch(ctx, batch)
	if err != nil {
		t.Fatalf("a batch with one locked account failed: %v", err)
	}
	if took := time.Since(began); took > wait/2 {
		t.Errorf("the batch took %v: it waited for the locked account", took)
	}
	for i, g := range got {
		onLocked := batch[i].Charge.AccountID == locked
		if g.Busy != onLocked || g.InFlight {
			t.Errorf("member %d (locked account: %v): busy %v, in flight %v", i, onLocked, g.Busy, g.InFlight)
		}
		if !onLocked && (g.Err != nil || g.Result.Status != http.StatusCreated) {
			t.Errorf("member %d on a free account: %d, %v; want 201", i, g.Result.Status, g.Err)
		}
	}
	if b, c := f.balance(t, free), f.balance(t, theirs); b != 9_300 || c != 9_700 {
		t.Errorf("free accounts' balances %d and %d, want 9300 and 9700", b, c)
	}
	if n := f.storedKeys(t, batch[0], batch[3]); n != 0 {
		t.Errorf("%d keys stored for the members that left, want 0", n)
	}
	h.release(t)
	for _, i := range []int{0, 3} {
		if res, err := f.s.RunChargeAlone(ctx, batch[i]); err != nil || res.Status != http.StatusCreated || res.Replayed {
			t.Errorf("member %d alone once the row is free: %+v, %v", i, res, err)
		}
	}
	if b := f.balance(t, locked); b != 9_500 {
		t.Errorf("the locked account's balance %d, want 9500", b)
	}

	// Through the group commit: the row held for half the bound, then
	// released; its charges succeed, nobody else waits.
	h = f.hold(t).account(t, locked)
	var reqs []chargedb.KeyedCharge
	for i := range 24 {
		acct := []uuid.UUID{locked, free, theirs}[i%3]
		reqs = append(reqs, f.charge(acct, 10))
	}
	released := make(chan struct{})
	time.AfterFunc(wait/2, func() { defer close(released); _ = h.tx.Rollback(context.Background()) })
	answers := f.chargeAll(ctx, reqs)
	<-released
	for i, a := range answers {
		onLocked := reqs[i].Charge.AccountID == locked
		if a.err != nil || a.res.Status != http.StatusCreated {
			t.Errorf("charge %d (locked account: %v): %d, %v; want 201", i, onLocked, a.res.Status, a.err)
		}
		if !onLocked && a.took > wait/2 {
			t.Errorf("charge %d on a free account took %v behind the locked one", i, a.took)
		}
	}
	if a, b, c := f.balance(t, locked), f.balance(t, free), f.balance(t, theirs); a != 9_420 || b != 9_220 || c != 9_620 {
		t.Errorf("balances %d, %d, %d; want 9420, 9220, 9620", a, b, c)
	}

	// Held past the bound: its charges answer 503 after about the bound,
	// having changed nothing; the others are decided at once.
	h = f.hold(t).account(t, locked)
	reqs = reqs[:0]
	for i := range 12 {
		reqs = append(reqs, f.charge([]uuid.UUID{locked, theirs}[i%2], 10))
	}
	for i, a := range f.chargeAll(ctx, reqs) {
		switch reqs[i].Charge.AccountID {
		case locked:
			if !errors.Is(a.err, payment.ErrUnavailable) || a.took < wait-clockSlack || a.took > wait+1500*time.Millisecond {
				t.Errorf("charge %d on the account held past the bound: %v after %v; want 503 after about %v", i, a.err, a.took, wait)
			}
		default:
			if a.err != nil || a.took > wait/2 {
				t.Errorf("charge %d on a free account: %v after %v", i, a.err, a.took)
			}
		}
	}
	h.release(t)
	if a, c := f.balance(t, locked), f.balance(t, theirs); a != 9_420 || c != 9_560 {
		t.Errorf("balances %d and %d after the 503s, want 9420 and 9560", a, c)
	}
	if n := f.storedKeys(t, reqs[0], reqs[2], reqs[4]); n != 0 {
		t.Errorf("%d keys stored for charges answered 503", n)
	}
}

// TestInFlightTwinLocksNothing: a retry whose twin is in flight (its key's
// lock and row, and its account's row, held by another transaction) leaves
// the batch without locking its account; its batch-mates commit at once;
// it waits for the twin alone and replays its answer, or answers 409 after
// the bound when the twin never ends.
func TestInFlightTwinLocksNothing(t *testing.T) {
	const wait = 2 * time.Second
	ctx := context.Background()
	f := newIsolationFixture(t, wait)
	acct, free, theirs := f.account(t, f.merchant, 10_000), f.account(t, f.merchant, 10_000), f.account(t, f.other, 10_000)
	retry := f.charge(acct, 100)
	h := f.hold(t).key(t, retry).account(t, acct)

	batch := []chargedb.KeyedCharge{retry, f.charge(free, 10), f.charge(theirs, 20)}
	began := time.Now()
	got, err := f.s.RunChargeBatch(ctx, batch)
	if err != nil {
		t.Fatalf("a batch with a twin in flight failed: %v", err)
	}
	if took := time.Since(began); took > wait/2 {
		t.Errorf("the batch took %v: it waited on the twin's account", took)
	}
	if !got[0].InFlight || got[0].Busy {
		t.Errorf("the retry: %+v, want in flight (not busy: its account must not be touched)", got[0])
	}
	for i, g := range got[1:] {
		if g.Err != nil || g.Result.Status != http.StatusCreated {
			t.Errorf("batch-mate %d: %d, %v", i+1, g.Result.Status, g.Err)
		}
	}

	// Through the group commit: the retry waits alone while fresh charges on
	// other accounts go through; the twin then answers (here: stores a 201
	// and commits), and the retry replays that answer.
	var reqs []chargedb.KeyedCharge
	reqs = append(reqs, retry)
	for i := range 16 {
		reqs = append(reqs, f.charge([]uuid.UUID{free, theirs}[i%2], 1))
	}
	answered := make(chan struct{})
	time.AfterFunc(wait/2, func() {
		defer close(answered)
		_, _ = h.tx.Exec(ctx, `UPDATE accounts SET balance = balance - 100 WHERE id = $1`, acct)
		_, _ = h.tx.Exec(ctx, `UPDATE idempotency_keys SET status = 201, body = '"the twin''s"', created_at = now() WHERE key = $1`, retry.Request.Key)
		_ = h.tx.Commit(ctx)
	})
	answers := f.chargeAll(ctx, reqs)
	<-answered
	if a := answers[0]; a.err != nil || !a.res.Replayed || string(a.res.Body) != `"the twin's"` {
		t.Errorf("the retry: %+v, %v; want the twin's answer replayed", a.res, a.err)
	}
	for i, a := range answers[1:] {
		if a.err != nil || a.took > wait/2 {
			t.Errorf("fresh charge %d: %v after %v, beside a retry waiting for its twin", i+1, a.err, a.took)
		}
	}
	if b := f.balance(t, acct); b != 9_900 {
		t.Errorf("the twin's account: %d, want 9900 (the twin's charge alone)", b)
	}

	// A twin that never ends: the retry answers 409 after the bound.
	again := f.charge(acct, 100)
	f.hold(t).key(t, again).account(t, acct)
	a := f.chargeAll(ctx, []chargedb.KeyedCharge{again})[0]
	if !errors.Is(a.err, idempotency.ErrKeyInUse) || a.took < wait-clockSlack || a.took > wait+1500*time.Millisecond {
		t.Errorf("retry of a twin that never ends: %v after %v; want ErrKeyInUse after about %v", a.err, a.took, wait)
	}
}

// TestFailingMemberLeavesTheBatch: a member whose own statement fails (here
// a trigger refuses charges of 13) gets the error alone; the batch is split
// until it is, and every other member commits with the answer it would have
// had alone.
func TestFailingMemberLeavesTheBatch(t *testing.T) {
	ctx := context.Background()
	f := newIsolationFixture(t, 2*time.Second)
	a, b := f.account(t, f.merchant, 1_000), f.account(t, f.other, 1_000)
	if _, err := f.s.Pool().Exec(ctx, `
CREATE FUNCTION refuse_13() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'planted failure of one member' USING ERRCODE = '22000'; END $$;
CREATE TRIGGER refuse_13 BEFORE INSERT ON charges FOR EACH ROW WHEN (NEW.amount = 13) EXECUTE FUNCTION refuse_13();`); err != nil {
		t.Fatal(err)
	}
	batch := []chargedb.KeyedCharge{
		f.charge(a, 100), f.charge(a, 13), f.charge(a, 200), f.charge(b, 13), f.charge(b, 50), f.charge(a, 900), f.charge(b, 1),
	}
	got, err := f.s.RunChargeBatch(ctx, batch)
	if err != nil {
		t.Fatalf("the batch failed as a whole: %v", err)
	}
	// a: 100 and 200 succeed, 900 is refused (402) against the 700 left.
	want := []int{201, 0, 201, 0, 201, 402, 201}
	for i, g := range got {
		switch {
		case want[i] == 0 && g.Err == nil:
			t.Errorf("member %d (the failing one): %d, no error", i, g.Result.Status)
		case want[i] != 0 && (g.Err != nil || g.Result.Status != want[i]):
			t.Errorf("member %d: %d, %v; want %d", i, g.Result.Status, g.Err, want[i])
		}
	}
	if x, y := f.balance(t, a), f.balance(t, b); x != 700 || y != 949 {
		t.Errorf("balances %d and %d, want 700 and 949", x, y)
	}
	if n := f.storedKeys(t, batch...); n != 5 {
		t.Errorf("%d keys stored, want 5 (not the failing members')", n)
	}
}

// TestAbandonedChargeIsUnavailable: a charge whose client leaves while its
// batch runs on another goroutine is answered 503 (payment.ErrUnavailable:
// its outcome is not known to the caller), never a bare context error (500,
// "nothing was changed"); it commits, its outcome is reported, and its retry
// replays it. A lone charge whose batch ran on its own goroutine answers its
// true outcome, reported too. One whose client leaves while it is queued is
// never executed, and reported so.
func TestAbandonedChargeIsUnavailable(t *testing.T) {
	ctx := context.Background()
	f := newIsolationFixture(t, 2*time.Second)
	acct := f.account(t, f.merchant, 1_000)
	if _, err := f.s.Pool().Exec(ctx, `
CREATE FUNCTION slow_7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$;
CREATE TRIGGER slow_7 BEFORE INSERT ON charges FOR EACH ROW WHEN (NEW.amount = 7) EXECUTE FUNCTION slow_7();`); err != nil {
		t.Fatal(err)
	}
	reported := func(want charging.AbandonedCharge) {
		t.Helper()
		select {
		case a := <-f.abandoned:
			if a.Outcome != want.Outcome || a.Status != want.Status || a.Request.Key != want.Request.Key {
				t.Errorf("reported %s %d for key %s, want %s %d for %s", a.Outcome, a.Status, a.Request.Key, want.Outcome, want.Status, want.Request.Key)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the outcome of %s was never reported", want.Request.Key)
		}
	}

	// Alone: its batch runs on its own goroutine, which answers truly.
	lone := f.charge(acct, 7)
	leaving, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	if res, err := f.s.CreateCharge(leaving, lone); err != nil || res.Status != http.StatusCreated {
		t.Errorf("a lone charge whose client left during its batch: %d, %v; want its true answer, 201", res.Status, err)
	}
	reported(charging.AbandonedCharge{Request: lone.Request, Outcome: charging.AbandonedExecuted, Status: http.StatusCreated})

	// In a batch run by another goroutine: 503, then its outcome.
	first := make(chan error, 1)
	go func() { _, err := f.s.CreateCharge(ctx, f.charge(acct, 7)); first <- err }()
	for f.s.Stats().BatchAge == 0 {
		time.Sleep(time.Millisecond)
	}
	second := f.charge(acct, 7)
	leaving, cancel = context.WithCancel(ctx)
	answer := make(chan error, 1)
	go func() { _, err := f.s.CreateCharge(leaving, second); answer <- err }()
	for f.s.Stats().Queued == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := <-first; err != nil { // the second's batch has left by now
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-answer; !errors.Is(err, payment.ErrUnavailable) {
		t.Fatalf("a charge whose client left during its batch: %v, want payment.ErrUnavailable", err)
	}
	reported(charging.AbandonedCharge{Request: second.Request, Outcome: charging.AbandonedExecuted, Status: http.StatusCreated})
	if res, err := f.s.CreateCharge(ctx, second); err != nil || !res.Replayed || res.Status != http.StatusCreated {
		t.Errorf("the retry: %+v, %v; want the 201 replayed", res, err)
	}
	if b := f.balance(t, acct); b != 979 {
		t.Errorf("balance %d, want 979", b)
	}

	// Queued behind a slow batch, its client leaves: never executed.
	go func() { _, err := f.s.CreateCharge(ctx, f.charge(acct, 7)); first <- err }()
	for f.s.Stats().BatchAge == 0 {
		time.Sleep(time.Millisecond)
	}
	queued := f.charge(acct, 5)
	leaving, cancel = context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := f.s.CreateCharge(leaving, queued); !errors.Is(err, context.Canceled) {
		t.Errorf("a charge whose client left while queued: %v, want context.Canceled", err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	reported(charging.AbandonedCharge{Request: queued.Request, Outcome: charging.AbandonedNotExecuted})
	if n := f.storedKeys(t, queued); n != 0 || f.balance(t, acct) != 972 {
		t.Errorf("%d keys stored for the charge that left the queue, balance %d; want 0 and 972", n, f.balance(t, acct))
	}
}

// TestStuckBatcherIsNotReady: while a charge batch runs past
// IDEMPOTENCY_WAIT + COMMIT_WAIT, the store is not Ready, queued charges get
// 503 after IDEMPOTENCY_WAIT without executing, and all is well again once
// the batch moves.
func TestStuckBatcherIsNotReady(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s := testkit.OpenService(t, url, postgres.Options{KeyWait: 200 * time.Millisecond, CommitWait: 100 * time.Millisecond}, charging.Options{})
	merchant, _, err := s.RegisterMerchant(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	acct := payment.NewID()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, 'USD', 1000)`, merchant, acct); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("a fresh store is not ready: %v", err)
	}
	release := s.StallChargeBatches()
	defer release()
	stuck := make(chan error, 1)
	go func() { _, err := s.CreateCharge(ctx, newCharge(merchant, acct, 100)); stuck <- err }()
	for s.Stats().BatchAge <= s.StuckAfter() {
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Ready(ctx); !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("with a batch stuck for %v: Ready = %v, want payment.ErrUnavailable", s.Stats().BatchAge, err)
	}
	began := time.Now()
	queued := newCharge(merchant, acct, 5)
	if _, err := s.CreateCharge(ctx, queued); !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("a charge queued behind the stuck batch: %v, want payment.ErrUnavailable", err)
	} else if took := time.Since(began); took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("it was answered after %v, want about IDEMPOTENCY_WAIT (200ms)", took)
	}
	if st := s.Stats(); st.QueueTimeouts != 1 || st.Queued != 0 {
		t.Errorf("stats %+v: want one queue timeout and an empty queue", st)
	}
	release()
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Errorf("once the batch moved: Ready = %v", err)
	}
	if _, keys, balance := counts(t, s, merchant, acct); keys != 1 || balance != 900 {
		t.Errorf("%d keys, balance %d; want the stuck charge only: 1, 900", keys, balance)
	}
}

// TestDepartedCallersChangeNothing: many charges through the group commit at
// once, a third of their callers leaving at a random moment (before their
// charge is queued, while it is queued, while its batch runs or commits).
// Every charge's outcome, told to its caller or, for those that left,
// reported afterwards, is its lone outcome (201: the balances always
// suffice) or "not executed"; the money and the rows are exactly those of the
// charges said to have executed; and a retry of each answers it: a replay of
// what executed, a fresh execution of what did not.
func TestDepartedCallersChangeNothing(t *testing.T) {
	ctx := context.Background()
	f := newIsolationFixture(t, 2*time.Second)
	accounts := []uuid.UUID{f.account(t, f.merchant, 1e9), f.account(t, f.merchant, 1e9), f.account(t, f.other, 1e9)}
	const n = 300
	reqs := make([]chargedb.KeyedCharge, n)
	for i := range reqs {
		reqs[i] = f.charge(accounts[i%len(accounts)], int64(1+i%50))
	}
	type outcome struct {
		executed, known bool
	}
	outcomes := make([]outcome, n)
	byKey := make(map[string]int, n)
	for i, r := range reqs {
		byKey[r.Request.Key] = i
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if i%3 == 0 {
				time.AfterFunc(time.Duration((i*13)%90)*time.Millisecond, cancel)
			}
			<-start
			res, err := f.s.CreateCharge(cctx, reqs[i])
			switch {
			case err == nil && res.Status == http.StatusCreated && !res.Replayed:
				outcomes[i] = outcome{executed: true, known: true}
			case err == nil:
				t.Errorf("charge %d: %d (replayed %v), want 201", i, res.Status, res.Replayed)
			case i%3 != 0:
				t.Errorf("charge %d, whose caller stayed: %v", i, err)
			case !errors.Is(err, payment.ErrUnavailable) && !errors.Is(err, context.Canceled):
				t.Errorf("charge %d, whose caller left: %v, want 503 or its own cancellation", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	// The reports of the departed, once their batches have answered.
	deadline := time.After(10 * time.Second)
	for reported := 0; ; {
		unknown := 0
		for i := range outcomes {
			if !outcomes[i].known {
				unknown++
			}
		}
		if unknown == 0 {
			break
		}
		select {
		case a := <-f.abandoned:
			i := byKey[a.Request.Key]
			reported++
			switch a.Outcome {
			case charging.AbandonedExecuted:
				if a.Status != http.StatusCreated {
					t.Errorf("charge %d reported executed with %d", i, a.Status)
				}
				if outcomes[i].known && !outcomes[i].executed {
					t.Errorf("charge %d reported executed after it was reported not executed", i)
				}
				outcomes[i] = outcome{executed: true, known: true}
			case charging.AbandonedNotExecuted:
				if outcomes[i].executed {
					t.Errorf("charge %d reported not executed, but its caller got 201", i)
				}
				outcomes[i] = outcome{known: true}
			default:
				t.Errorf("charge %d reported %s (%v)", i, a.Outcome, a.Err)
				outcomes[i].known = true
			}
		case <-deadline:
			t.Fatalf("%d charges whose callers left were never reported (%d reports)", unknown, reported)
		}
	}
	executed, want := 0, map[uuid.UUID]int64{}
	for i, o := range outcomes {
		if o.executed {
			executed++
			want[reqs[i].Charge.AccountID] += reqs[i].Charge.Amount
		}
	}
	for _, a := range accounts {
		if got := 1e9 - f.balance(t, a); got != want[a] {
			t.Errorf("account %s was debited %d, want %d (the executed charges)", a, got, want[a])
		}
	}
	if got := f.storedKeys(t, reqs...); got != executed {
		t.Errorf("%d keys stored, want %d (the executed charges)", got, executed)
	}
	for i, r := range reqs {
		res, err := f.s.CreateCharge(ctx, r)
		if err != nil || res.Status != http.StatusCreated || res.Replayed != outcomes[i].executed {
			t.Errorf("retry of charge %d (executed: %v): %d replayed %v, %v", i, outcomes[i].executed, res.Status, res.Replayed, err)
		}
	}
	t.Logf("%d charges, %d callers left: %d executed, %d not", n, n/3, executed, n-executed)
}
