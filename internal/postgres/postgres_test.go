package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
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

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, url string) *postgres.Store {
	t.Helper()
	// Registered first, so it runs last: once the store is closed, its pool
	// and its notifier goroutine must be gone.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	s, err := postgres.Open(context.Background(), url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestJanitorDeletesOnlyExpiredKeysInBatches fills a database with expired and
// live keys: a sweep removes exactly the expired ones, in bounded batches, and
// a second janitor stands aside while the first holds the lock.
func TestJanitorDeletesOnlyExpiredKeysInBatches(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.NewDatabase(t))
	merchant := uuid.New()
	_, err := s.Pool().Exec(ctx, `
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, body, created_at)
SELECT $1::uuid, 'old-' || g, '\x00'::bytea, 201, '{}'::bytea, now() - interval '25 hours' FROM generate_series(1, 2500) g
UNION ALL
SELECT $1::uuid, 'live-' || g, '\x00'::bytea, 201, '{}'::bytea, now() - interval '23 hours' FROM generate_series(1, 300) g`, merchant)
	if err != nil {
		t.Fatal(err)
	}

	// While another transaction holds the janitor lock, a janitor does nothing.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(0x7061796d_6a616e69)); err != nil {
		t.Fatal(err)
	}
	if n, ran, err := s.DeleteExpiredKeys(ctx, 24*time.Hour, 1000); err != nil || ran || n != 0 {
		t.Errorf("with the lock taken: deleted %d, ran %v, %v", n, ran, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	j := idempotency.NewJanitor(s, slog.New(slog.NewTextHandler(io.Discard, nil)), 24*time.Hour, time.Hour, 1000, time.Millisecond)
	if !j.CaughtUp().IsZero() {
		t.Error("a janitor that never swept has caught up")
	}
	began := time.Now().Truncate(time.Second)
	if n, err := j.Sweep(ctx); err != nil || n != 2500 {
		t.Errorf("swept %d keys (%v), want 2500", n, err)
	}
	if at := j.CaughtUp(); at.Before(began) {
		t.Errorf("after a whole sweep, caught up at %v, want since %v", at, began)
	}
	var old, live int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE key LIKE 'old-%'), count(*) FILTER (WHERE key LIKE 'live-%') FROM idempotency_keys`).Scan(&old, &live); err != nil {
		t.Fatal(err)
	}
	if old != 0 || live != 300 {
		t.Errorf("%d expired and %d live keys left, want 0 and 300", old, live)
	}
}

// TestJanitorStopsAtADatabaseError: a sweep that cannot reach the database
// returns the error at once rather than hammering the database in a loop while
// it is down, and logs nothing: Run logs the outage (janitor_test.go).
func TestJanitorStopsAtADatabaseError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every connection is refused
	s := open(t, "postgres://postgres@"+addr+"/payments?connect_timeout=5")

	var logs bytes.Buffer
	j := idempotency.NewJanitor(s, slog.New(slog.NewTextHandler(&logs, nil)), 24*time.Hour, time.Hour, 1000, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := j.Sweep(ctx)
	if err == nil || !errors.Is(err, payment.ErrUnavailable) || n != 0 || !j.CaughtUp().IsZero() {
		t.Errorf("swept %d keys without a database (%v), caught up at %v; want 0 and ErrUnavailable", n, err, j.CaughtUp())
	}
	if ctx.Err() != nil {
		t.Error("the sweep ran until its context ended instead of stopping at the error")
	}
	if logs.Len() != 0 {
		t.Errorf("the sweep logged:\n%s", logs.String())
	}
}

// TestCommitsWithEventsWakeTheRelay: a transaction that wrote an event sends
// NOTIFY payments_events once it has committed, so the relay publishes at once
// instead of at its next poll. One that wrote no event (a replay, a refusal)
// or rolled back sends none.
func TestCommitsWithEventsWakeTheRelay(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t) // no other test's commits notify here
	s := open(t, url)
	listener := listen(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	created := idempotency.Response{Status: 201, Body: []byte(`{}`)}
	openAccount := func(_ context.Context, l payment.Ledger) (idempotency.Response, error) {
		_, err := l.CreateAccount(ctx, merchant, payment.NewAccount{Currency: "USD"})
		return created, err
	}
	req := idempotency.Request{MerchantID: merchant, Key: "open", Fingerprint: idempotency.Fingerprint{1}}

	if _, err := testkit.Execute(ctx, s, req, openAccount); err != nil {
		t.Fatal(err)
	}
	if !notified(t, listener, 10*time.Second) {
		t.Fatal("no notification within 10 s of a committed event")
	}
	// A spurious notification would follow within milliseconds (the notifier
	// sends at most one per 10 ms); half a second is ample.
	const quiet = 500 * time.Millisecond
	if res, err := testkit.Execute(ctx, s, req, openAccount); err != nil || !res.Replayed {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if notified(t, listener, quiet) {
		t.Error("a replay, which writes no event, notified")
	}
	refusal := func(context.Context, payment.Ledger) (idempotency.Response, error) {
		return idempotency.Response{Status: 404, Body: []byte(`{}`)}, nil
	}
	if _, err := testkit.Execute(ctx, s, idempotency.Request{MerchantID: merchant, Key: "refused"}, refusal); err != nil {
		t.Fatal(err)
	}
	if notified(t, listener, quiet) {
		t.Error("a refusal, which writes no event, notified")
	}
	fault := errors.New("fault after the event")
	failing := func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
		if _, err := openAccount(ctx, l); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{}, fault
	}
	if _, err := testkit.Execute(ctx, s, idempotency.Request{MerchantID: merchant, Key: "failing"}, failing); !errors.Is(err, fault) {
		t.Fatalf("failing operation: %v, want %v", err, fault)
	}
	if notified(t, listener, quiet) {
		t.Error("a rolled-back transaction notified")
	}
	var accounts int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM accounts WHERE merchant_id = $1`, merchant).Scan(&accounts); err != nil || accounts != 1 {
		t.Errorf("%d accounts (%v), want 1", accounts, err)
	}
}

// connect opens a connection to url of the test's own, closed when it ends.
var connect = testkit.Connect

// listen opens a connection to url that listens on payments_events.
func listen(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn := connect(t, url)
	if _, err := conn.Exec(context.Background(), "LISTEN payments_events"); err != nil {
		t.Fatal(err)
	}
	return conn
}

// notifications counts the notifications conn receives, up to max, until
// none has come for quiet.
func notifications(t *testing.T, conn *pgx.Conn, quiet time.Duration, max int) int {
	t.Helper()
	for n := 0; n < max; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		_, err := conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return max
}

// notified reports whether conn receives a notification within d.
func notified(t *testing.T, conn *pgx.Conn, d time.Duration) bool {
	t.Helper()
	return notifications(t, conn, d, 1) == 1
}

// openAccounts opens n accounts for merchant, one transaction each, each
// with its account.created event.
func openAccounts(s *postgres.Store, merchant uuid.UUID, n int) error {
	for range n {
		_, err := testkit.Execute(context.Background(), s, idempotency.Request{MerchantID: merchant, Key: uuid.NewString()},
			func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
				_, err := l.CreateAccount(ctx, merchant, payment.NewAccount{Currency: "USD"})
				return idempotency.Response{Status: 201, Body: []byte(`{}`)}, err
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// TestNotifyIsPaced: a burst of commits sends at most one NOTIFY per 10 ms
// (and one more at the end), not one per commit. The bound scales with the
// time the burst took, so a slow machine loosens it rather than failing it.
func TestNotifyIsPaced(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	listener := listen(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}

	const commits = 200
	began := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := openAccounts(s, merchant, commits/4); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	n := notifications(t, listener, 300*time.Millisecond, commits)
	if limit := int(took/(10*time.Millisecond)) + 2; n < 1 || n > limit {
		t.Errorf("%d notifications for %d commits in %v; want 1 to %d", n, commits, took, limit)
	}
}

// TestNotifierOutlivesAFailedNotify: when a NOTIFY fails (the database is
// briefly away), the next commit still wakes the relay.
func TestNotifierOutlivesAFailedNotify(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// The service's connections resolve pg_notify to a function of this
	// database that fails the first time it is called.
	if _, err := admin.Exec(ctx, `
CREATE SEQUENCE notify_attempts;
CREATE FUNCTION public.pg_notify(channel text, payload text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('public.notify_attempts') = 1 THEN
        RAISE EXCEPTION 'injected: NOTIFY failed';
    END IF;
    PERFORM pg_catalog.pg_notify(channel, payload);
END $$;
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = public, pg_catalog', current_database()); END $$;`); err != nil {
		t.Fatal(err)
	}
	s := open(t, url)
	listener := listen(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	attempts := func() int {
		t.Helper()
		var n int
		if err := admin.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM notify_attempts`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	if err := openAccounts(s, merchant, 1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); attempts() < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no NOTIFY attempted within 10 s of a commit")
		}
	}
	if notified(t, listener, 300*time.Millisecond) {
		t.Fatal("a notification from the NOTIFY that failed")
	}
	if err := openAccounts(s, merchant, 1); err != nil {
		t.Fatal(err)
	}
	if !notified(t, listener, 10*time.Second) {
		t.Error("no notification within 10 s of the commit after the failed NOTIFY")
	}
}

// TestExhaustedPoolIsUnavailable: a request that finds every pooled
// connection taken for the whole wait bound is told the service is
// unavailable, to retry later; one whose client has gone gets its context's
// error. Nothing executes in either case.
func TestExhaustedPoolIsUnavailable(t *testing.T) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, pgtest.DatabaseURL(t), postgres.Options{MaxConns: 1, KeyWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	merchant, _, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.Pool().Acquire(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	executed := false
	op := func(context.Context, payment.Ledger) (idempotency.Response, error) {
		executed = true
		return idempotency.Response{Status: 201}, nil
	}
	req := idempotency.Request{MerchantID: merchant, Key: "k"}
	if _, err := testkit.Execute(ctx, s, req, op); !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("with the pool exhausted: %v, want ErrUnavailable", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := testkit.Execute(gone, s, req, op); !errors.Is(err, context.Canceled) || errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("with the client gone: %v, want context.Canceled", err)
	}
	held.Release()
	if executed {
		t.Error("the operation ran without a connection")
	}
	if res, err := testkit.Execute(ctx, s, req, op); err != nil || res.Status != 201 || !executed {
		t.Errorf("with the connection back: %+v, %v; want the operation's 201", res, err)
	}
}

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.DatabaseURL(t))
	id, newKey, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	key := newKey.Secret
	for range 2 { // the second answer comes from the cache
		if got, err := s.Authenticate(ctx, key, "test"); err != nil || got != id {
			t.Errorf("Authenticate = %v, %v; want %v", got, err, id)
		}
	}
	if _, err := s.Authenticate(ctx, key+"x", "test"); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Errorf("a wrong key: %v", err)
	}
	var stored []byte
	if err := s.Pool().QueryRow(ctx, `SELECT hash FROM api_keys WHERE merchant_id = $1`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 32 || string(stored) == key {
		t.Error("the API key is not stored as a SHA-256 hash")
	}
}

// TestChargesWakeTheRelay: a charge batch's commit that writes an event
// notifies the relay (ChargeDB's Commit); a replay, which writes none, does
// not.
func TestChargesWakeTheRelay(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s := testkit.NewService(open(t, url), postgres.Options{}, charging.Options{})
	merchant, _, err := s.RegisterMerchant(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	account := payment.NewID()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, 'USD', 10000)`,
		merchant, account); err != nil {
		t.Fatal(err)
	}
	listener := listen(t, url)
	req := chargedb.KeyedCharge{
		Request: idempotency.Request{MerchantID: merchant, Key: "k-" + uuid.NewString(), Fingerprint: idempotency.Fingerprint{1}},
		Charge:  payment.NewCharge{AccountID: account, Amount: 100, Currency: "USD"},
		Render:  testkit.RenderCharge,
	}
	if _, err := s.CreateCharge(ctx, req); err != nil {
		t.Fatal(err)
	}
	if !notified(t, listener, 10*time.Second) {
		t.Fatal("no notification within 10 s of a charge")
	}
	if res, err := s.CreateCharge(ctx, req); err != nil || !res.Replayed {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if notified(t, listener, 500*time.Millisecond) {
		t.Error("a replayed charge, which writes no event, notified")
	}
}

// TestLockTimeoutRoundsUp: the pool's lock_timeout is KeyWait in whole
// milliseconds, rounded up, so that a bound under a millisecond's fraction
// never becomes 0 (no bound at all) or a shorter wait.
func TestLockTimeoutRoundsUp(t *testing.T) {
	ctx := context.Background()
	url := pgtest.DatabaseURL(t)
	for _, tc := range []struct {
		wait time.Duration
		want string
	}{{1500 * time.Microsecond, "2ms"}, {time.Millisecond, "1ms"}, {5 * time.Second, "5s"}} {
		s, err := postgres.Open(ctx, url, postgres.Options{KeyWait: tc.wait})
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = s.Pool().QueryRow(ctx, `SHOW lock_timeout`).Scan(&got)
		s.Close()
		if err != nil || got != tc.want {
			t.Errorf("KeyWait %v: lock_timeout %q (%v), want %q", tc.wait, got, err, tc.want)
		}
	}
}
