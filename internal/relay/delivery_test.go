package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/payments/internal/consumer"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/relay"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestEveryEventPublishedOnceInOrder: each committed event reaches the stream
// exactly once, with its id as Nats-Msg-Id, in the feed's order.
func TestEveryEventPublishedOnceInOrder(t *testing.T) {
	e := setup(t)
	r, _ := e.startRelay()
	accounts := []uuid.UUID{e.account(10_000), e.account(10_000), e.account(10_000)}
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() { e.charge(accounts[i%3], 100) })
	}
	wg.Wait()
	e.waitUntil("the outbox is drained", e.drained)

	events := e.count(`SELECT count(*) FROM events`)
	msgs := e.streamMessages()
	if len(msgs) != events || events != 3*2+60 {
		t.Fatalf("%d messages in the stream, %d events in the table, want %d of each", len(msgs), events, 3*2+60)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.Headers().Get(jetstream.MsgIDHeader))
		if want := relay.SubjectPrefix; len(m.Subject()) <= len(want) || m.Subject()[:len(want)] != want {
			t.Errorf("subject %q", m.Subject())
		}
		if m.Headers().Get(relay.MerchantHeader) != e.merchant.String() {
			t.Errorf("merchant header %q", m.Headers().Get(relay.MerchantHeader))
		}
	}
	if want := e.feedOrder(); !slices.Equal(got, want) {
		t.Errorf("stream order differs from the feed's order:\n got %v\nwant %v", got, want)
	}
	if r.Stats.Published.Load() != int64(events) || r.Stats.Duplicates.Load() != 0 {
		t.Errorf("published %d, duplicates %d", r.Stats.Published.Load(), r.Stats.Duplicates.Load())
	}
}

// TestNATSOutageLosesNothing: with the broker down, 1,000 charges wait in the
// table; when it returns, all of them arrive.
func TestNATSOutageLosesNothing(t *testing.T) {
	e := setup(t)
	e.startRelay()
	accounts := []uuid.UUID{e.account(99_999_999), e.account(99_999_999)}
	e.waitUntil("the first events are published", e.drained)
	before := len(e.streamMessages())

	e.nats.Stop()
	const charges = 1000
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				e.charge(accounts[i%2], 7)
			}
		})
	}
	for i := range charges {
		work <- i
	}
	close(work)
	wg.Wait()
	if n := e.count(`SELECT count(*) FROM unpublished_events`); n != charges {
		t.Fatalf("%d unpublished events while NATS is down, want %d", n, charges)
	}

	e.nats.Start()
	e.waitUntil("the backlog drains", e.drained)
	msgs := e.streamMessages()
	succeeded := 0
	for _, m := range msgs[before:] {
		if m.Subject() == relay.SubjectPrefix+payment.EventChargeSucceeded {
			succeeded++
		}
	}
	if len(msgs)-before != charges || succeeded != charges {
		t.Errorf("%d new messages, %d charge.succeeded; want %d of each", len(msgs)-before, succeeded, charges)
	}
	if ids := e.feedOrder(); len(ids) != len(msgs) {
		t.Errorf("%d events, %d messages", len(ids), len(msgs))
	}
}

// TestRefusedEventIsNeverOvertaken: when the stream refuses one event of a
// batch (it is over the stream's MaxMsgSize), no later event of the batch is
// stored before it, and only the acknowledged prefix is marked published; once
// the stream takes it, every event arrives once, in feed order, and is marked.
// Without the chaining by expected last message id, the events after the
// refused one would overtake it; marking before the acknowledgements would
// mark the refused one.
func TestRefusedEventIsNeverOvertaken(t *testing.T) {
	const maxMsgSize = 8 << 10
	big := payment.NewAccount{
		Currency:    "USD",
		Description: new(strings.Repeat("d", payment.MaxDescriptionLength)),
		Metadata:    map[string]string{},
	}
	for i := range 20 { // with the description, over 11 KB of event
		big.Metadata["key"+strconv.Itoa(i)] = strings.Repeat("m", payment.MaxMetadataValueLen)
	}

	cases := []struct {
		name   string
		before int // events committed before the refused one
	}{
		{"first in its batch", 0},
		{"in the middle of its batch", 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			js := e.jetStream()
			// The relay keeps the stream it finds: this one is the relay's
			// with a per-message size limit.
			cfg := jetstream.StreamConfig{
				Name:       relay.Stream,
				Subjects:   []string{relay.SubjectPrefix + ">"},
				Storage:    jetstream.FileStorage,
				Duplicates: 2 * time.Minute,
				MaxMsgSize: maxMsgSize,
			}
			if _, err := js.CreateStream(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}

			// Every event is committed before the relay starts, and the
			// relay starts only once it can read them all, so its first
			// batch holds all of them.
			if tc.before > 0 {
				small := e.openAccount(payment.NewAccount{Currency: "USD"})
				for range tc.before - 1 {
					e.deposit(small, 100)
				}
			}
			refused := e.openAccount(big)
			e.deposit(refused, 1000)
			e.charge(refused, 100)
			e.charge(refused, 200)
			feed := e.feedOrder()
			acked, held := feed[:tc.before], feed[tc.before:]

			e.waitUntil("every event is readable by the relay", func() bool { return e.readable() == len(feed) })

			refusals := &refusalLog{}
			e.log = slog.New(refusals)
			r, _ := e.startRelay()

			e.waitUntil("the stream has refused the big event once", func() bool { return refusals.count() >= 1 })
			if got := e.unpublished(); !slices.Equal(got, held) {
				t.Fatalf("after the refusal, unpublished events:\n got %v\nwant %v (the refused event and every later one)", got, held)
			}
			// Every attempt goes out on one connection and the stream decides
			// its messages in order, so once the retry's first message is
			// refused, every message of the first attempt has been decided.
			e.waitUntil("the stream has refused the big event twice", func() bool { return refusals.count() >= 2 })
			if got := msgIDs(e.streamMessages()); !slices.Equal(got, acked) {
				t.Fatalf("while the big event is refused, the stream holds:\n got %v\nwant %v (only the events before it)", got, acked)
			}

			cfg.MaxMsgSize = -1
			if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			e.waitUntil("the outbox is drained after the limit is lifted", e.drained)
			if got := msgIDs(e.streamMessages()); !slices.Equal(got, feed) {
				t.Errorf("after the limit is lifted, the stream holds:\n got %v\nwant %v (every event once, in feed order)", got, feed)
			}
			if p, d := r.Stats.Published.Load(), r.Stats.Duplicates.Load(); p != int64(len(feed)) || d != 0 {
				t.Errorf("published %d, duplicates %d; want %d and 0", p, d, len(feed))
			}
		})
	}
}

// TestCrashBetweenPublishAndMarkIsDeduplicated: a relay that dies after
// publishing but before marking leaves the events unpublished; the next relay
// publishes them again, JetStream reports duplicates, and the consumer applies
// each event once.
func TestCrashBetweenPublishAndMarkIsDeduplicated(t *testing.T) {
	e := setup(t)
	acct := e.account(1000)
	e.charge(acct, 300)
	events := e.count(`SELECT count(*) FROM events`) // account, deposit, charge
	// So that the crash comes after all three are published, not after a
	// first batch that a transaction elsewhere on the server cut short.
	e.waitUntil("every event is readable by the relay", func() bool { return e.readable() == events })

	crashed, stop, ended := e.runRelay(func(r *relay.Relay) {
		r.SetBeforeMark(func() error { return errors.New("killed") })
	})
	// The relay must stop by itself: stopping it from here could cancel
	// its context first, and Run returns nil for a cancelled context.
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not stop at the crash point within 30 s")
	}
	if err := stop(); err == nil || crashed.Stats.Published.Load() != int64(events) {
		t.Fatalf("the crashed relay published %d events and returned %v; want %d and an error", crashed.Stats.Published.Load(), err, events)
	}
	if n := e.count(`SELECT count(*) FROM unpublished_events`); n != events {
		t.Fatalf("%d unpublished events after the crash, want %d", n, events)
	}

	next, _ := e.startRelay()
	e.waitUntil("the next relay has drained the outbox", e.drained)
	if next.Stats.Duplicates.Load() != int64(events) || next.Stats.Published.Load() != 0 {
		t.Errorf("republish: %d duplicates (want %d), %d new", next.Stats.Duplicates.Load(), events, next.Stats.Published.Load())
	}
	if n := len(e.streamMessages()); n != events {
		t.Errorf("%d messages in the stream, want %d", n, events)
	}

	c := e.startConsumer(e.log)
	e.waitUntil("the consumer applied every event", func() bool { return c.Stats.Applied.Load() == int64(events) })
	balance, applied, err := consumer.NewInbox(e.store.DB).ProjectedBalance(context.Background(), e.merchant, acct)
	if err != nil || balance != 700 || applied != int64(events) {
		t.Errorf("projected balance %d from %d events (%v), want 700 from %d", balance, applied, err, events)
	}
}

// TestConsumerAppliesEachEventOnce drives the consumer end to end, then
// redelivers every event: the projection must equal the real balances.
// Some charges fail, so charge.failed events go through too. The consumer
// logs each event it applies, once, at INFO.
func TestConsumerAppliesEachEventOnce(t *testing.T) {
	const (
		deposit = 2000
		amount  = 150
		charges = 20 // per account: 13 are covered (1,950), the 14th to 20th fail
		failed  = 2 * (charges - deposit/amount)
	)
	e := setup(t)
	e.startRelay()
	logs := &testkit.LogBuffer{}
	c := e.startConsumer(slog.New(slog.NewJSONHandler(logs, nil)))
	accounts := []uuid.UUID{e.account(deposit), e.account(deposit)}
	for i := range 2 * charges {
		e.charge(accounts[i%2], amount)
	}
	events := int64(e.count(`SELECT count(*) FROM events`))
	e.waitUntil("every event is applied", func() bool { return c.Stats.Applied.Load() == events })

	msgs := e.streamMessages()
	inOutbox := e.count(`SELECT count(*) FROM events WHERE type = 'charge.failed'`)
	inStream := 0
	for _, m := range msgs {
		if m.Subject() == relay.SubjectPrefix+payment.EventChargeFailed {
			inStream++
		}
	}
	if inOutbox != failed || inStream != failed {
		t.Fatalf("charge.failed: %d events in the outbox, %d messages in the stream; want %d of each", inOutbox, inStream, failed)
	}
	logged := map[string]int{}
	for _, l := range testkit.JSONLog(t, logs.String(), "event applied") {
		if l["level"] == "INFO" {
			id, _ := l["event_id"].(string)
			logged[id]++
		}
	}
	if int64(len(logged)) != events {
		t.Errorf("%d events logged as applied, want %d", len(logged), events)
	}
	for id, n := range logged {
		if n != 1 {
			t.Errorf("event %s logged as applied %d times", id, n)
		}
	}

	// A redelivery of everything, as after a consumer crash before its acks.
	for _, m := range msgs {
		effect, err := consumer.Effect(m.Headers().Get(relay.MerchantHeader), m.Data())
		if err != nil {
			t.Fatal(err)
		}
		if applied, err := consumer.NewInbox(e.store.DB).ApplyOnce(context.Background(), consumer.Name, effect); err != nil || applied {
			t.Fatalf("redelivered event applied again (%v)", err)
		}
	}
	for _, acct := range accounts {
		a, err := e.store.Account(context.Background(), e.merchant, acct)
		if err != nil {
			t.Fatal(err)
		}
		projected, _, err := consumer.NewInbox(e.store.DB).ProjectedBalance(context.Background(), e.merchant, acct)
		if err != nil || projected != a.Balance || a.Balance != deposit%amount {
			t.Errorf("account %s: projected %d, real %d (%v); want %d for both", acct, projected, a.Balance, err, deposit%amount)
		}
	}
}

// TestOneRelayLeadsAndAnotherTakesOver: of two relays only one publishes; when
// it stops, the standby takes over.
func TestOneRelayLeadsAndAnotherTakesOver(t *testing.T) {
	e := setup(t)
	first, stopFirst := e.startRelay()
	e.waitUntil("the first relay leads", first.Stats.Leader.Load)
	second, _ := e.startRelay()
	acct := e.account(1000)
	e.waitUntil("the outbox is drained", e.drained)
	time.Sleep(300 * time.Millisecond) // give the standby every chance to misbehave
	if second.Stats.Leader.Load() || second.Stats.Published.Load() != 0 {
		t.Fatalf("the standby published %d events", second.Stats.Published.Load())
	}
	if first.Stats.Published.Load() != 2 {
		t.Errorf("the leader published %d events, want 2", first.Stats.Published.Load())
	}

	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
	e.waitUntil("the standby takes over", second.Stats.Leader.Load)
	e.charge(acct, 10)
	e.waitUntil("the outbox is drained", e.drained)
	if second.Stats.Published.Load() != 1 {
		t.Errorf("the new leader published %d events, want 1", second.Stats.Published.Load())
	}
	if n := len(e.streamMessages()); n != 3 {
		t.Errorf("%d messages, want 3", n)
	}
}

// startConsumer runs the worked-example consumer, logging to log, until the
// test ends.
func (e *env) startConsumer(log *slog.Logger) *consumer.Consumer {
	e.t.Helper()
	c, err := consumer.New(consumer.NewInbox(e.store.DB), e.nats.Connect(), log)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Error(err)
		}
	})
	return c
}

// TestPublishedEventsArePrunedAfterRetention: events published longer ago
// than the retention go, in bounded batches; unpublished and recent ones stay.
func TestPublishedEventsArePrunedAfterRetention(t *testing.T) {
	e := setup(t)
	// The relays' own log, shown if the test fails: it failed in CI four
	// times (the fourth at 96e7579, 2026-12-06), with the old events gone and
	// neither relay counting a prune, which only an error after the delete
	// committed seems to explain; the second relay's Run error is shown too.
	var logs testkit.LogBuffer
	e.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	acct := e.account(1000)
	for range 5 {
		e.charge(acct, 1)
	}
	first, stop := e.startRelay()
	e.waitUntil("the outbox is drained", e.drained)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Age five of the seven published events past the 30-day retention.
	if _, err := e.store.Pool().Exec(context.Background(), `
UPDATE events SET created_at = now() - interval '31 days'
WHERE id IN (SELECT id FROM events ORDER BY tx_id, seq LIMIT 5)`); err != nil {
		t.Fatal(err)
	}
	e.charge(acct, 1) // one more, unpublished until the next relay runs

	r, stopSecond := e.startRelay()
	defer func() {
		if t.Failed() { // what the relays got to (it failed in CI twice, on 2026-12-06 with the old events gone and none pruned by this relay)
			t.Logf("the relay: leader %t, published %d, duplicates %d, pruned %d (the first relay: published %d, pruned %d); "+
				"%d events, %d unpublished, the old ones %d",
				r.Stats.Leader.Load(), r.Stats.Published.Load(), r.Stats.Duplicates.Load(), r.Stats.Pruned.Load(),
				first.Stats.Published.Load(), first.Stats.Pruned.Load(),
				e.count(`SELECT count(*) FROM events`), e.count(`SELECT count(*) FROM unpublished_events`),
				e.count(`SELECT count(*) FROM events WHERE created_at < now() - interval '30 days'`))
			t.Logf("the relays' log:\n%s", logs.Tail(4000))
			t.Logf("the second relay's Run returned: %v", stopSecond())
		}
	}()
	e.waitUntil("the old events are pruned", func() bool { return r.Stats.Pruned.Load() == 5 })
	e.waitUntil("the outbox is drained", e.drained)
	if n := e.count(`SELECT count(*) FROM events`); n != 3 {
		t.Errorf("%d events left, want 3 (two recent, one new)", n)
	}
}
