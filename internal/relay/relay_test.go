package relay_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/relay"
	"github.com/exactlyonce/payments/internal/testkit"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's database, broker and merchant.
type env struct {
	t        testing.TB
	store    testkit.Service
	nats     *testkit.NATS
	merchant uuid.UUID
	log      *slog.Logger
}

func setup(t *testing.T) *env {
	t.Helper()
	// Registered first, so it runs last: after the relay, the broker and the
	// pool have stopped, no goroutine of theirs may be left behind.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	return setupBench(t)
}

// setupBench is setup without the leak check, which benchmarks cannot run.
func setupBench(t testing.TB) *env {
	t.Helper()
	store := testkit.OpenService(t, pgtest.NewDatabase(t), postgres.Options{}, charging.Options{})
	merchant, _, err := store.RegisterMerchant(context.Background(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, store: store, nats: testkit.StartNATS(t), merchant: merchant,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// exec runs one ledger operation under a fresh idempotency key.
func (e *env) exec(op func(ctx context.Context, l payment.Ledger) error) {
	e.t.Helper()
	var fp idempotency.Fingerprint
	_, _ = rand.Read(fp[:])
	req := idempotency.Request{MerchantID: e.merchant, Key: uuid.NewString(), Fingerprint: fp}
	_, err := e.store.Execute(context.Background(), req, func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("{}")}, op(ctx, l)
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// account opens a funded account.
func (e *env) account(deposit int64) uuid.UUID {
	e.t.Helper()
	id := e.openAccount(payment.NewAccount{Currency: "USD"})
	e.deposit(id, deposit)
	return id
}

// openAccount creates an account as given, unfunded: one account.created event.
func (e *env) openAccount(in payment.NewAccount) uuid.UUID {
	e.t.Helper()
	var id uuid.UUID
	e.exec(func(ctx context.Context, l payment.Ledger) error {
		a, err := l.CreateAccount(ctx, e.merchant, in)
		id = a.ID
		return err
	})
	return id
}

func (e *env) deposit(account uuid.UUID, amount int64) {
	e.t.Helper()
	e.exec(func(ctx context.Context, l payment.Ledger) error {
		_, err := l.Deposit(ctx, e.merchant, account, amount)
		return err
	})
}

// charge charges the account through the service's charge path, under a
// fresh key; a charge the balance does not cover is recorded as failed.
func (e *env) charge(account uuid.UUID, amount int64) {
	e.t.Helper()
	var fp idempotency.Fingerprint
	_, _ = rand.Read(fp[:])
	_, err := e.store.CreateCharge(context.Background(), chargedb.KeyedCharge{
		Request: idempotency.Request{MerchantID: e.merchant, Key: uuid.NewString(), Fingerprint: fp},
		Charge:  payment.NewCharge{AccountID: account, Amount: amount, Currency: "USD"},
		Render: func(payment.Charge, []byte, error) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("{}")}, nil
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// startRelay runs a relay until the test ends or stop is called; stop
// returns what Run returned.
func (e *env) startRelay(configure ...func(*relay.Relay)) (r *relay.Relay, stop func() error) {
	e.t.Helper()
	r, stop, _ = e.runRelay(configure...)
	return r, stop
}

// runRelay is startRelay that also returns a channel closed when Run
// returns, for a test whose relay stops by itself; stop then returns Run's
// result without cancelling anything.
func (e *env) runRelay(configure ...func(*relay.Relay)) (r *relay.Relay, stop func() error, ended <-chan struct{}) {
	e.t.Helper()
	r, err := relay.New(e.store, e.nats.Connect(), e.log, relay.Options{Poll: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range configure {
		c(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = r.Run(ctx)
	}()
	stop = func() error {
		cancel()
		<-done
		return runErr
	}
	e.t.Cleanup(func() { _ = stop() })
	return r, stop, done
}

func (e *env) count(sql string) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(context.Background(), sql).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// waitUntil polls cond until it holds or 30 s pass.
func (e *env) waitUntil(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) drained() bool {
	return e.count(`SELECT count(*) FROM unpublished_events`) == 0
}

// readable counts the unpublished events the relay can read: those of
// transactions older than every transaction still running on the server
// (any database's, other tests' included), as in postgres.unpublishedSQL.
func (e *env) readable() int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM unpublished_events
WHERE tx_id < pg_snapshot_xmin(pg_current_snapshot())`)
}

// jetStream opens a JetStream client of its own on the test's broker.
func (e *env) jetStream() jetstream.JetStream {
	e.t.Helper()
	js, err := jetstream.New(e.nats.Connect())
	if err != nil {
		e.t.Fatal(err)
	}
	return js
}

// streamMessages reads the whole stream in order.
func (e *env) streamMessages() []jetstream.Msg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := e.jetStream().Stream(ctx, relay.Stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for uint64(len(msgs)) < info.State.Msgs {
		batch, err := cons.Fetch(min(500, int(info.State.Msgs)-len(msgs)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if batch.Error() != nil && !errors.Is(batch.Error(), nats.ErrTimeout) {
			e.t.Fatal(batch.Error())
		}
	}
	return msgs
}

// msgIDs returns the messages' Nats-Msg-Id headers (the event ids), in order.
func msgIDs(msgs []jetstream.Msg) []string {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
	}
	return ids
}

// feedOrder returns every event id in the order the feed and the relay use.
func (e *env) feedOrder() []string {
	e.t.Helper()
	return e.eventIDs("TRUE")
}

// unpublished returns the ids of the events after the relay's cursor, in feed
// order.
func (e *env) unpublished() []string {
	e.t.Helper()
	return e.eventIDs("(tx_id, seq) > (SELECT tx_id, seq FROM outbox_cursor WHERE stream = 'relay')")
}

// eventIDs returns the ids of the events matching the SQL condition where, in
// feed order.
func (e *env) eventIDs(where string) []string {
	e.t.Helper()
	rows, err := e.store.Pool().Query(context.Background(), `SELECT id FROM events WHERE `+where+` ORDER BY tx_id, seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, payment.FormatID(payment.PrefixEvent, id))
	}
	return ids
}

// refusalLog is a log handler that counts the relay's interrupted batches
// whose error is the stream refusing a message over its MaxMsgSize. The relay
// logs the interruption after it has marked the batch's acknowledged prefix.
type refusalLog struct {
	mu sync.Mutex
	n  int
}

func (l *refusalLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *refusalLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *refusalLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
			l.mu.Lock()
			l.n++
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *refusalLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *refusalLog) WithGroup(string) slog.Handler      { return l }
