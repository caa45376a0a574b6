package postgres

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// standInTxSQL is confirmTxSQL with the synchronous standby played by an
// advisory lock of the test's database (a server's synchronous_standby_names
// would hold every other test's commits too): its transaction takes an id,
// as confirmSQL's message gives the real one, then waits for the lock,
// shared, as the real one waits at its COMMIT for the standby. While a test
// holds the lock, the standby is away.
const standInTxSQL = `BEGIN; ` + snapshotSQL + `; ` +
	`SELECT pg_current_xact_id(), set_config('lock_timeout', '0', true); ` +
	`SELECT pg_current_xact_id_if_assigned()::text FROM pg_advisory_xact_lock_shared(4646); COMMIT`

// standby is the stand-in's synchronous standby: away while its connection
// holds the lock.
type standby struct{ conn *pgx.Conn }

// openWithStandIn opens a store on a database of the test's own whose
// confirmation rounds wait for the stand-in standby, and the standby,
// present. The store is closed when the test ends, and its goroutines must be
// gone then.
func openWithStandIn(t *testing.T, opts Options) (*Store, *standby) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	s, err := Open(context.Background(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.DB.confirmed.txSQL = standInTxSQL // before any round: none runs until something commits or a read asks
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // before Close: the standby comes back
	return s, &standby{conn: conn}
}

func (b *standby) away(t *testing.T) { b.exec(t, `SELECT pg_advisory_lock(4646)`) }
func (b *standby) back(t *testing.T) { b.exec(t, `SELECT pg_advisory_unlock(4646)`) }

func (b *standby) exec(t *testing.T, sql string) {
	t.Helper()
	if _, err := b.conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// waitingForStandby counts the rounds waiting for the stand-in standby.
func (b *standby) waitingForStandby(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.conn.QueryRow(context.Background(), `
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND objid = 4646 AND NOT granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// currentSnapshot is what a read would see now, as pg_snapshot's text.
func currentSnapshot(t *testing.T, s *Store) string {
	t.Helper()
	var text string
	if err := s.Pool().QueryRow(context.Background(), snapshotSQL).Scan(&text); err != nil {
		t.Fatal(err)
	}
	return text
}

// eventually reports whether cond comes true within a bound far above
// confirmEvery.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// confirmed reports whether the store's confirmed snapshot covers seen.
func confirmed(t *testing.T, s *Store, seen string) func() bool {
	snap, err := parseSnapshot(seen)
	if err != nil {
		t.Fatal(err)
	}
	return func() bool { return s.DB.confirmed.known.Load().covers(snap) }
}

// rounds reports whether at least n confirmation rounds have committed.
func rounds(s *Store, n int64) func() bool {
	return func() bool { return s.DB.confirmed.rounds.Load() >= n }
}

// TestReadOfDataOlderThanAnOutageAnswers: a commit is confirmed by a round
// that runs after it with no read asking; so once the synchronous standby
// has gone away, a read of what was committed before answers, and does not
// wait for it. A round asked for meanwhile waits for the standby, alone:
// asking again starts no other, and it ends once the standby is back.
func TestReadOfDataOlderThanAnOutageAnswers(t *testing.T) {
	ctx := context.Background()
	s, standby := openWithStandIn(t, Options{CommitWait: time.Second})
	merchant, key, err := s.RegisterMerchant(ctx, "before the outage")
	if err != nil {
		t.Fatal(err)
	}
	seen := currentSnapshot(t, s) // what a read of the merchant's keys sees
	if !eventually(rounds(s, 1)) {
		t.Error("no confirmation round followed the commit: a read waits for one")
	}
	// The server is shared: other tests' transactions may have ended between
	// that round and seen. One more of the store's brings the next round.
	s.DB.transactionEnded()
	if !eventually(confirmed(t, s, seen)) {
		t.Errorf("no confirmation round covered the commit (%d rounds)", s.DB.confirmed.rounds.Load())
	}

	// On a server of its own, a read's snapshot from now on sees what seen
	// does and the commits waiting for the standby, in progress; here other
	// tests' commits do not wait for the stand-in, so a read is judged on
	// seen (confirmSeen, read's last step).
	standby.away(t)
	if err := s.DB.confirmSeen(ctx, seen, nil); err != nil {
		t.Errorf("with the standby away, a read of what was committed before: %v, want an answer", err)
	}

	// Asked for, a round waits for the standby; the callers give up after
	// CommitWait, and the round waits on.
	const callers = 4
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() { errs <- s.Confirm(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, payment.ErrUnavailable) {
			t.Errorf("confirm with the standby away: %v, want %v", err, payment.ErrUnavailable)
		}
	}
	started := s.DB.confirmed.rounds.Load()
	if err := s.Confirm(ctx); !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("confirm with the standby away: %v, want %v", err, payment.ErrUnavailable)
	}
	if n := s.DB.confirmed.rounds.Load(); n != started {
		t.Errorf("%d rounds started while one waited for the standby, want none", n-started)
	}
	if n := standby.waitingForStandby(t); n != 1 {
		t.Errorf("%d rounds wait for the standby, want 1", n)
	}
	if err := s.DB.confirmSeen(ctx, seen, nil); err != nil {
		t.Errorf("with a round waiting for the standby, a read of what was committed before: %v, want an answer", err)
	}

	standby.back(t)
	keys, err := s.ListAPIKeys(ctx, merchant)
	if err != nil || len(keys) != 1 || keys[0].ID != key.ID {
		t.Errorf("with the standby back, the merchant's keys: %+v, %v; want its key %s", keys, err, key.ID)
	}
}

// TestNoRoundsWithoutCommits: a store that commits nothing runs no
// confirmation round, and one that committed runs one, then none.
func TestNoRoundsWithoutCommits(t *testing.T) {
	ctx := context.Background()
	s, _ := openWithStandIn(t, Options{})
	time.Sleep(10 * confirmEvery)
	if n := s.DB.confirmed.rounds.Load(); n != 0 {
		t.Errorf("%d confirmation rounds with nothing committed, want 0", n)
	}
	if _, _, err := s.RegisterMerchant(ctx, "one commit"); err != nil {
		t.Fatal(err)
	}
	if !eventually(rounds(s, 1)) {
		t.Fatal("no confirmation round followed the commit")
	}
	time.Sleep(10 * confirmEvery)
	if n := s.DB.confirmed.rounds.Load(); n != 1 {
		t.Errorf("%d confirmation rounds after one commit, want 1", n)
	}
}

// TestCloseEndsARoundWaitingForTheStandby: Close does not wait for an
// absent standby, and leaves no goroutine behind (openWithStandIn); a read
// asking for a round after it is answered at once.
func TestCloseEndsARoundWaitingForTheStandby(t *testing.T) {
	ctx := context.Background()
	s, standby := openWithStandIn(t, Options{CommitWait: 200 * time.Millisecond})
	standby.away(t)
	if err := s.Confirm(ctx); !errors.Is(err, payment.ErrUnavailable) {
		t.Fatalf("confirm with the standby away: %v, want %v", err, payment.ErrUnavailable)
	}
	s.Close()
	if err := s.Confirm(ctx); !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("confirm after Close: %v, want %v", err, payment.ErrUnavailable)
	}
}
