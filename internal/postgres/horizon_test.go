package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
)

// holder is a transaction held open on a connection of its own, with a
// transaction id (it has written, or asked for one).
type holder struct {
	conn *pgx.Conn
	pid  int32
	xid  uint64
}

// hold begins a transaction in the database at url and gives it an id.
func hold(t *testing.T, url string) *holder {
	t.Helper()
	ctx := context.Background()
	h := &holder{conn: connect(t, url)}
	if _, err := h.conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := h.conn.QueryRow(ctx, `SELECT pg_backend_pid(), pg_current_xact_id()::text::bigint`).Scan(&h.pid, &h.xid); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *holder) end(t *testing.T, sql string) {
	t.Helper()
	if _, err := h.conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// insertEventSQL writes an event as the store does (tx_id and seq from their
// defaults), without the money movement behind it.
const insertEventSQL = `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES ($1, $2, 'account', $2, 'account.created', '{}')`

// feed reads the merchant's whole feed, page by page, as a client would.
func feed(t *testing.T, s *postgres.Store, merchant uuid.UUID) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	q := payment.EventQuery{Limit: 3}
	for {
		p, err := s.Events(context.Background(), merchant, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Items {
			ids = append(ids, e.ID)
		}
		if !p.HasMore {
			return ids
		}
		last := ids[len(ids)-1]
		q.StartingAfter = &last
	}
}

// unpublished reads what the relay would publish next.
func unpublished(t *testing.T, s *postgres.Store) []uuid.UUID {
	t.Helper()
	lease, err := s.ClaimOutbox(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	events, err := lease.Unpublished(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for _, e := range events {
		ids = append(ids, e.ID)
	}
	return ids
}

// writeEvents commits n events of the merchant, one transaction each, and
// returns their ids in commit order.
func writeEvents(t *testing.T, s *postgres.Store, merchant uuid.UUID, n int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for range n {
		id := uuid.New()
		if _, err := s.Pool().Exec(context.Background(), insertEventSQL, merchant, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func newMerchant(t *testing.T, s *postgres.Store) uuid.UUID {
	t.Helper()
	m, _, err := s.RegisterMerchant(context.Background(), "acme-"+uuid.NewString()[:8])
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTransactionInAnotherDatabaseHoldsNoEvent: a writing transaction held
// open in another database of the same server delays neither the feed nor the
// relay: events committed meanwhile are listed by the first read after their
// commit, and nothing is reported as held.
func TestTransactionInAnotherDatabaseHoldsNoEvent(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	merchant := newMerchant(t, s)
	before := writeEvents(t, s, merchant, 2)

	foreign := hold(t, pgtest.NewDatabase(t))
	if _, err := foreign.conn.Exec(context.Background(), `CREATE TABLE batch_job (n int); INSERT INTO batch_job VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	after := writeEvents(t, s, merchant, 3)
	want := append(slices.Clone(before), after...)
	if got := feed(t, s, merchant); !slices.Equal(got, want) {
		t.Errorf("with a transaction open in another database, the feed lists %v\nwant %v (every event, at once)", got, want)
	}
	if got := unpublished(t, s); !slices.Equal(got, want) {
		t.Errorf("with a transaction open in another database, the relay reads %v\nwant %v", got, want)
	}
	mon := monitor(t, url)
	time.Sleep(50 * time.Millisecond) // a held event would now be at least this old
	if st, err := mon.Outbox(context.Background()); err != nil || st.Held != 0 || st.Holder != nil {
		t.Errorf("Monitor.Outbox = %+v, %v; want nothing held", st, err)
	}

	// Under REPEATABLE READ the caller's read shares the function's snapshot,
	// so the function falls back to the server's horizon, which the foreign
	// transaction holds.
	tx, err := s.Pool().BeginTx(context.Background(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var horizon uint64
	if err := tx.QueryRow(context.Background(), `SELECT horizon::text::bigint FROM payments_event_horizon()`).Scan(&horizon); err != nil {
		t.Fatal(err)
	}
	if horizon > foreign.xid {
		t.Errorf("under REPEATABLE READ the horizon is %d, above the running transaction %d of another database", horizon, foreign.xid)
	}
	foreign.end(t, "ROLLBACK")
}

// TestTransactionInThisDatabaseHoldsEvents: a transaction of this database
// still running holds back every event committed after it began, in the feed
// and at the relay (its own events, committed last, must come first: that is
// what keeps the feed gap-free); the monitor names it, and how long events
// have waited for it. Once it commits, everything is listed in order.
func TestTransactionInThisDatabaseHoldsEvents(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	merchant := newMerchant(t, s)
	before := writeEvents(t, s, merchant, 2)

	late := hold(t, url)
	lateEvent := uuid.New()
	if _, err := late.conn.Exec(context.Background(), insertEventSQL, merchant, lateEvent); err != nil {
		t.Fatal(err)
	}
	after := writeEvents(t, s, merchant, 3)
	if got := feed(t, s, merchant); !slices.Equal(got, before) {
		t.Errorf("while an older transaction of this database runs, the feed lists %v\nwant only %v", got, before)
	}
	if got := unpublished(t, s); !slices.Equal(got, before) {
		t.Errorf("while an older transaction of this database runs, the relay reads %v\nwant only %v", got, before)
	}
	mon := monitor(t, url)
	const wait = 300 * time.Millisecond
	time.Sleep(wait)
	st, err := mon.Outbox(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Held < wait || st.Holder == nil || st.Holder.PID != late.pid || st.Holder.XID != late.xid || st.Holder.Age < wait {
		t.Errorf("Monitor.Outbox = %+v (holder %+v); want events held at least %v by pid %d, xid %d, running at least as long",
			st, st.Holder, wait, late.pid, late.xid)
	}

	late.end(t, "COMMIT")
	want := append(append(slices.Clone(before), lateEvent), after...)
	if got := feed(t, s, merchant); !slices.Equal(got, want) {
		t.Errorf("after the late commit, the feed lists %v\nwant %v (the late event before those committed meanwhile)", got, want)
	}
	if got := unpublished(t, s); !slices.Equal(got, want) {
		t.Errorf("after the late commit, the relay reads %v\nwant %v", got, want)
	}
	if st, err := mon.Outbox(context.Background()); err != nil || st.Held != 0 || st.Holder != nil {
		t.Errorf("after the late commit, Monitor.Outbox = %+v, %v; want nothing held", st, err)
	}
}

// TestPreparedTransactionHoldsEvents: a prepared transaction of this database
// has no backend, and holds the events back all the same.
func TestPreparedTransactionHoldsEvents(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	var max int
	if err := s.Pool().QueryRow(context.Background(), `SELECT current_setting('max_prepared_transactions')::int`).Scan(&max); err != nil {
		t.Fatal(err)
	}
	if max == 0 {
		t.Skip("this server has max_prepared_transactions = 0, so no transaction can be prepared (the test containers set it)")
	}
	merchant := newMerchant(t, s)
	before := writeEvents(t, s, merchant, 1)
	prepared := hold(t, url)
	lateEvent := uuid.New()
	if _, err := prepared.conn.Exec(context.Background(), insertEventSQL, merchant, lateEvent); err != nil {
		t.Fatal(err)
	}
	gid := "payments-test-" + uuid.NewString()
	prepared.end(t, "PREPARE TRANSACTION '"+gid+"'")
	t.Cleanup(func() { // if the test fails before committing it
		_, _ = s.Pool().Exec(context.Background(), "ROLLBACK PREPARED '"+gid+"'")
	})
	after := writeEvents(t, s, merchant, 2)
	if got := feed(t, s, merchant); !slices.Equal(got, before) {
		t.Errorf("while a prepared transaction waits, the feed lists %v\nwant only %v", got, before)
	}
	st, err := monitor(t, url).Outbox(context.Background())
	if err != nil || st.Holder == nil || st.Holder.PID != 0 || st.Holder.XID != prepared.xid {
		t.Errorf("Monitor.Outbox = %+v, %v; want the prepared transaction %d named", st, err, prepared.xid)
	}
	if _, err := s.Pool().Exec(context.Background(), "COMMIT PREPARED '"+gid+"'"); err != nil {
		t.Fatal(err)
	}
	want := append(append(slices.Clone(before), lateEvent), after...)
	if got := feed(t, s, merchant); !slices.Equal(got, want) {
		t.Errorf("after COMMIT PREPARED, the feed lists %v\nwant %v", got, want)
	}
}

// TestFeedUnderRandomInterleaving: transactions of this database (and of
// another) begin, write events, wait, and commit or roll back at random, many
// at once, while a reader pages the feed and a relay reads and marks the
// outbox without pause. Each sees every committed event exactly once, in
// (tx_id, seq) order, and no rolled-back one. The horizon's reads race the
// transactions' starts and ends here thousands of times; reading the
// backends before the snapshot, or the events in the horizon's statement,
// loses events in this test (checked by planting each).
func TestFeedUnderRandomInterleaving(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	merchant := newMerchant(t, s)
	foreignURL := pgtest.NewDatabase(t)

	// Few writers, with pauses between their transactions: the races that
	// matter need the transaction starting or ending at that moment to be the
	// only one of the database running, which many writers make rare.
	const (
		writers  = 3
		duration = 3 * time.Second
	)
	ctx := context.Background()
	var (
		mu        sync.Mutex
		committed = map[uuid.UUID]bool{}
		done      atomic.Bool
		wg        sync.WaitGroup
		start     = make(chan struct{})
	)
	write := func(url string, record bool, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 17))
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		<-start
		for !done.Load() {
			time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			var ids []uuid.UUID
			for range 1 + rng.IntN(3) {
				if record {
					id := uuid.New()
					_, err = tx.Exec(ctx, insertEventSQL, merchant, id)
					ids = append(ids, id)
				} else {
					_, err = tx.Exec(ctx, `INSERT INTO batch_job VALUES (1)`)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rng.IntN(2) == 0 {
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
				}
			}
			if rng.IntN(5) == 0 {
				err = tx.Rollback(ctx)
			} else if err = tx.Commit(ctx); err == nil && record {
				mu.Lock()
				for _, id := range ids {
					committed[id] = true
				}
				mu.Unlock()
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}
	for i := range writers {
		wg.Go(func() { write(url, true, uint64(i)) })
	}
	if _, err := connect(t, foreignURL).Exec(ctx, `CREATE TABLE batch_job (n int)`); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { write(foreignURL, false, 100) })

	// The feed reader follows the feed with its cursor, as a client would.
	var (
		fromFeed, fromRelay []uuid.UUID
		feedRead            atomic.Int64 // len(fromFeed), for the catching up below
		readers             sync.WaitGroup
		readersDone         atomic.Bool
	)
	readers.Go(func() {
		q := payment.EventQuery{Limit: 5}
		<-start
		for !readersDone.Load() {
			p, err := s.Events(ctx, merchant, q)
			if err != nil {
				t.Error(err)
				return
			}
			for _, e := range p.Items {
				fromFeed = append(fromFeed, e.ID)
			}
			feedRead.Store(int64(len(fromFeed)))
			if len(p.Items) > 0 {
				last := p.Items[len(p.Items)-1].ID
				q.StartingAfter = &last
			}
		}
	})
	// The relay reads the oldest unpublished events and marks them.
	readers.Go(func() {
		lease, err := s.ClaimOutbox(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer lease.Close()
		<-start
		for !readersDone.Load() {
			events, err := lease.Unpublished(ctx, 7)
			if err == nil && len(events) > 0 {
				err = lease.MarkPublished(ctx, events)
			}
			if err != nil {
				t.Error(err)
				return
			}
			for _, e := range events {
				fromRelay = append(fromRelay, e.ID)
			}
		}
	})

	close(start)
	time.Sleep(duration)
	done.Store(true)
	wg.Wait()
	// Everything has ended: the readers catch up, then stop.
	deadline := time.Now().Add(10 * time.Second)
	total := countOf(t, s, `SELECT count(*) FROM events WHERE merchant_id = $1`, merchant)
	for countOf(t, s, `SELECT count(*) FROM unpublished_events`) > 0 || feedRead.Load() < int64(total) {
		if time.Now().After(deadline) {
			break // the comparison below says what is missing
		}
		time.Sleep(10 * time.Millisecond)
	}
	readersDone.Store(true)
	readers.Wait()

	rows, err := s.Pool().Query(ctx, `SELECT id FROM events WHERE merchant_id = $1 ORDER BY tx_id, seq`, merchant)
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != len(committed) {
		t.Fatalf("the table holds %d events, the writers committed %d", len(order), len(committed))
	}
	for _, id := range order {
		if !committed[id] {
			t.Fatalf("event %s is in the table but was never committed", id)
		}
	}
	for name, got := range map[string][]uuid.UUID{"feed": fromFeed, "relay": fromRelay} {
		if !slices.Equal(got, order) {
			t.Errorf("the %s read %d events, want the %d committed, once each, in (tx_id, seq) order: %s",
				name, len(got), len(order), firstDifference(got, order))
		}
	}
	t.Logf("%d events committed in %v; the feed read them, the relay too", len(order), duration)
}

func firstDifference(got, want []uuid.UUID) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("first difference at %d: %s, want %s", i, got[i], want[i])
		}
	}
	return fmt.Sprintf("one is a prefix of the other (%d and %d)", len(got), len(want))
}

// monitor opens a Monitor of the database at url.
func monitor(t *testing.T, url string) *postgres.Monitor {
	t.Helper()
	mon, err := postgres.OpenMonitor(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mon.Close)
	return mon
}

func countOf(t *testing.T, s *postgres.Store, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHorizonInterleavings runs every order of a transaction T's begin and
// commit, and of a later transaction U's commit, around the steps of the
// horizon: S0 (its snapshot), H (payments_event_horizon_after(S0): this
// database's backends and prepared transactions), R (a read of the events
// below H, in the next statement, as the feed and the relay do). Whatever the
// order, what R lists is a prefix of the final (tx_id, seq) order: no event
// can later appear before the last one R listed, which a reader's cursor would
// then have passed.
func TestHorizonInterleavings(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	ctx := context.Background()
	steps := []string{"S0", "H", "R", "Tbegin", "Tcommit", "U"}
	before := func(a, b string) func([]string) bool {
		return func(seq []string) bool { return slices.Index(seq, a) < slices.Index(seq, b) }
	}
	rules := []func([]string) bool{before("S0", "H"), before("H", "R"), before("Tbegin", "Tcommit"), before("Tbegin", "U")}
	var orders [][]string
	var permute func(prefix, rest []string)
	permute = func(prefix, rest []string) {
		if len(rest) == 0 {
			for _, ok := range rules {
				if !ok(prefix) {
					return
				}
			}
			orders = append(orders, slices.Clone(prefix))
			return
		}
		for i := range rest {
			permute(append(prefix, rest[i]), append(slices.Clone(rest[:i]), rest[i+1:]...))
		}
	}
	permute(nil, steps)
	if len(orders) != 40 {
		t.Fatalf("%d orders, want 40", len(orders))
	}

	// Every order begins T and commits it, so one connection serves them all.
	conn, tconn := connect(t, url), connect(t, url)
	for _, order := range orders {
		merchant := newMerchant(t, s)
		var (
			s0      string
			horizon uint64
			listed  []uuid.UUID
		)
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%v: %v", order, err)
			}
		}
		for _, step := range order {
			switch step {
			case "S0":
				must(conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&s0))
			case "H":
				must(conn.QueryRow(ctx, `SELECT horizon::text::bigint FROM payments_event_horizon_after($1::pg_snapshot)`, s0).Scan(&horizon))
			case "R":
				rows, err := conn.Query(ctx, `SELECT id FROM events WHERE merchant_id = $1 AND tx_id < $2::text::xid8 ORDER BY tx_id, seq`,
					merchant, fmt.Sprint(horizon))
				must(err)
				listed, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
				must(err)
			case "Tbegin":
				_, err := tconn.Exec(ctx, "BEGIN")
				must(err)
				_, err = tconn.Exec(ctx, insertEventSQL, merchant, uuid.New())
				must(err)
			case "Tcommit":
				_, err := tconn.Exec(ctx, "COMMIT")
				must(err)
			case "U":
				_, err := s.Pool().Exec(ctx, insertEventSQL, merchant, uuid.New())
				must(err)
			}
		}
		rows, err := conn.Query(ctx, `SELECT id FROM events WHERE merchant_id = $1 ORDER BY tx_id, seq`, merchant)
		must(err)
		final, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		must(err)
		if len(final) != 2 || len(listed) > len(final) || !slices.Equal(listed, final[:len(listed)]) {
			t.Errorf("%v: R listed %v, which is not a prefix of the final order %v", order, listed, final)
		}
	}
}
