package postgres

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
)

// created is FanOut's count of deliveries created, for the tests that
// count them.
func created(r payment.FanOut, err error) (int, error) { return r.Created, err }

// TestFanOutAgainWhileEventsWaitAboveTheHorizon: an event committed while an
// older transaction still runs is above the event horizon, so a fan-out
// skips it, and asks to be called again; once that transaction ends, the
// next fan-out delivers it and asks for nothing more. Events of a merchant
// without a live endpoint waiting there ask for nothing. Without any
// endpoint at all, a fan-out says it is idle.
func TestFanOutAgainWhileEventsWaitAboveTheHorizon(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	addEvent(t, s, acme, payment.EventAccountCreated)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Idle: true}) {
		t.Errorf("FanOut without any endpoint = %+v, %v; want idle", r, err)
	}
	addEndpoint(t, s, acme, payment.AllEvents)

	older, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx) // a no-op once committed below
	if _, err := older.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	addEvent(t, s, globex, payment.EventAccountCreated)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{}) {
		t.Errorf("FanOut with only globex's event above the horizon = %+v, %v; want nothing, not again", r, err)
	}
	addEvent(t, s, acme, payment.EventAccountCreated)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Again: true}) {
		t.Errorf("FanOut with acme's event above the horizon = %+v, %v; want none created, again", r, err)
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Created: 1, Again: false}) {
		t.Errorf("FanOut once the older transaction ended = %+v, %v; want 1 created, not again", r, err)
	}
}

// TestWatchEvents: every watcher receives after events commit, a burst of
// commits leaves one signal pending, and an ended watch receives nothing.
func TestWatchEvents(t *testing.T) {
	s := openStore(t, pgtest.NewDatabase(t))
	first, unwatchFirst := s.WatchEvents()
	second, unwatchSecond := s.WatchEvents()
	defer unwatchSecond()
	s.DB.eventsCommitted()
	s.DB.eventsCommitted()
	for name, c := range map[string]<-chan struct{}{"first": first, "second": second} {
		if len(c) != 1 {
			t.Errorf("%s watcher holds %d signals after two commits, want 1", name, len(c))
		}
		<-c
	}
	unwatchFirst()
	s.DB.eventsCommitted()
	if len(first) != 0 || len(second) != 1 {
		t.Errorf("after the first watch ended: first holds %d, second %d; want 0 and 1", len(first), len(second))
	}
}

// settle fans out with batch until a round creates nothing and asks for no
// other, and returns how many rounds that took.
func settle(t *testing.T, s *Store, batch int) int {
	t.Helper()
	for rounds := 1; rounds <= 100; rounds++ {
		r, err := s.FanOut(context.Background(), batch)
		if err != nil {
			t.Fatal(err)
		}
		if r.Created == 0 && !r.Again {
			return rounds
		}
	}
	t.Fatal("the fan-out did not settle in 100 rounds")
	return 0
}

// addEvents writes n events of the merchant in one transaction, and
// returns their ids in feed order.
func addEvents(t *testing.T, s *Store, merchant uuid.UUID, eventType string, n int) []uuid.UUID {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `
WITH added AS (
    INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
    SELECT $1, gen_random_uuid(), 'account', gen_random_uuid(), $2, '{}' FROM generate_series(1, $3::int)
    RETURNING id, seq
)
SELECT id FROM added ORDER BY seq`, merchant, eventType, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// behind is the endpoints flagged behind.
func behind(t *testing.T, s *Store) []uuid.UUID {
	t.Helper()
	rows, _ := s.Pool().Query(context.Background(), `SELECT id FROM webhook_endpoints WHERE behind ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// pastPosition says whether the fan-out's position is past the event.
func pastPosition(t *testing.T, s *Store, event uuid.UUID) bool {
	t.Helper()
	var past bool
	if err := s.Pool().QueryRow(context.Background(), `
SELECT (p.tx_id, p.seq) >= (e.tx_id, e.seq) FROM webhook_fanout_position p, events e WHERE e.id = $1`, event).Scan(&past); err != nil {
		t.Fatal(err)
	}
	return past
}

// TestFanOutCatchesUpAcrossRounds: an endpoint with more new events than a
// batch gets a batch a round, and the rest in the rounds after, although
// those rounds read only the events committed since (another merchant's,
// each delivered in its round); the fan-out asks to run again until it has
// caught up, and every event is delivered once.
func TestFanOutCatchesUpAcrossRounds(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	slow, steady := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, globex, payment.AllEvents)
	settle(t, s, 100)

	var want []delivery
	for _, e := range addEvents(t, s, acme, payment.EventChargeSucceeded, 250) {
		want = append(want, delivery{slow, e, "pending"})
	}
	for i, round := range []payment.FanOut{{Created: 101, Again: true}, {Created: 101, Again: true}, {Created: 51}} {
		e := addEvent(t, s, globex, payment.EventChargeSucceeded)
		want = append(want, delivery{steady, e, "pending"})
		if r, err := s.FanOut(ctx, 100); err != nil || r != round {
			t.Errorf("round %d = %+v, %v; want %+v", i+1, r, err, round)
		}
		if !pastPosition(t, s, e) {
			t.Errorf("round %d left the position before globex's event", i+1)
		}
	}
	if got := deliveries(t, s); !slices.Equal(got, sortDeliveries(want)) {
		t.Errorf("%d deliveries, want %d, each once", len(got), len(want))
	}
	if got := behind(t, s); len(got) != 0 {
		t.Errorf("endpoints %v still behind", got)
	}
}

// TestFanOutTouchesNoIdleEndpoint: rounds that fan events out to one
// merchant's endpoint, with another merchant's events flowing, write no row
// of the endpoints whose merchants wrote nothing (their xmin stays).
func TestFanOutTouchesNoIdleEndpoint(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	active := addEndpoint(t, s, acme, payment.AllEvents)
	for i := range 3 {
		idle := newMerchant(t, s, fmt.Sprintf("idle %d", i))
		for range payment.MaxWebhookEndpoints {
			addEndpoint(t, s, idle, payment.AllEvents)
		}
	}
	settle(t, s, 100)
	versions := func() map[uuid.UUID]string {
		t.Helper()
		rows, _ := s.Pool().Query(ctx, `SELECT id, xmin::text FROM webhook_endpoints`)
		out := map[uuid.UUID]string{}
		var (
			id      uuid.UUID
			version string
		)
		if _, err := pgx.ForEachRow(rows, []any{&id, &version}, func() error { out[id] = version; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := versions()

	for range 5 {
		addEvent(t, s, acme, payment.EventChargeSucceeded)
		addEvent(t, s, globex, payment.EventChargeSucceeded)
		if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Created: 1}) {
			t.Fatalf("FanOut = %+v, %v; want 1 created", r, err)
		}
	}
	after := versions()
	if after[active] == before[active] {
		t.Error("the active endpoint's row was not written: the test shows nothing")
	}
	delete(before, active)
	delete(after, active)
	if !maps.Equal(after, before) {
		t.Errorf("idle endpoints written: xmin before %v, after %v", before, after)
	}
}

// TestFanOutMissesNothingOfEndpointsCreatedOrEnabledMeanwhile: a round that
// runs while an endpoint is created, and another enabled again, sees neither
// and moves its position past an event both are to receive (of a
// transaction older than both); the rounds after deliver it to each, once.
func TestFanOutMissesNothingOfEndpointsCreatedOrEnabledMeanwhile(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	l := lifecycle{t, s}
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	addEndpoint(t, s, globex, payment.AllEvents) // caught up: the position matters
	again := addEndpoint(t, s, acme, payment.AllEvents)
	settle(t, s, 100) // caught up, then disabled: not behind
	if _, err := l.update(acme, again, payment.WebhookEndpointUpdate{Enabled: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	settle(t, s, 100)

	older, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx) // a no-op once committed
	if _, err := older.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	creating, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer creating.Rollback(ctx)
	created, err := createEndpoint(ctx, creating, acme, "http://127.0.0.1:1/hook", []string{payment.AllEvents}, "whsec_"+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	enabling, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer enabling.Rollback(ctx)
	if _, err := updateEndpoint(ctx, enabling, acme, again, payment.WebhookEndpointUpdate{Enabled: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	x := webhooktest.AddEvent(t, older, acme, payment.EventChargeSucceeded)
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	if r, err := s.FanOut(ctx, 100); err != nil || r.Created != 0 {
		t.Fatalf("the round across the creation and the enabling = %+v, %v; want none created", r, err)
	}
	if !pastPosition(t, s, x) {
		t.Fatal("the round across them left its position before the event: the test shows nothing")
	}
	for _, tx := range []pgx.Tx{creating, enabling} {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// No later event of acme's to bring the endpoints into a round: they
	// are read because they are behind.
	settle(t, s, 100)
	want := sortDeliveries([]delivery{{created.ID, x, "pending"}, {again, x, "pending"}})
	if got := deliveries(t, s); !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
	y := addEvent(t, s, acme, payment.EventChargeSucceeded)
	settle(t, s, 100)
	want = sortDeliveries(append(want, delivery{created.ID, y, "pending"}, delivery{again, y, "pending"}))
	if got := deliveries(t, s); !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
}

// TestFanOutDeliversEachEventOncePerEndpoint: rounds in small batches while
// three merchants write, one of them a burst longer than a round's scan and
// without any endpoint: each endpoint gets each of its merchant's events it
// subscribes to exactly once, and no other.
func TestFanOutDeliversEachEventOncePerEndpoint(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex, initech := newMerchant(t, s, "acme"), newMerchant(t, s, "globex"), newMerchant(t, s, "initech")
	all, charges := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, acme, payment.EventChargeSucceeded)
	other := addEndpoint(t, s, globex, payment.AllEvents)
	settle(t, s, 100)

	var want []delivery
	for round := range 12 {
		for _, e := range addEvents(t, s, acme, payment.EventChargeSucceeded, round%4) {
			want = append(want, delivery{all, e, "pending"}, delivery{charges, e, "pending"})
		}
		want = append(want, delivery{all, addEvent(t, s, acme, payment.EventRefundCreated), "pending"})
		for _, e := range addEvents(t, s, globex, payment.EventChargeFailed, 5) {
			want = append(want, delivery{other, e, "pending"})
		}
		addEvents(t, s, initech, payment.EventChargeSucceeded, 2)
		if round == 6 {
			addEvents(t, s, initech, payment.EventChargeSucceeded, fanOutScan+500)
		}
		r, err := s.FanOut(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		if round == 6 && !r.Again {
			t.Errorf("the round that read a full scan = %+v; want again", r)
		}
	}
	settle(t, s, 3)
	if got := deliveries(t, s); !slices.Equal(got, sortDeliveries(want)) {
		t.Errorf("%d deliveries, want %d: each subscribed event once per endpoint", len(got), len(want))
	}
}

// TestFanOutSkipsATimeWithoutEndpoints: the events written while no endpoint
// was live are not read again, a scan at a time, once one is: the first
// round moves the position to the horizon, and the endpoint gets the events
// from its creation on.
func TestFanOutSkipsATimeWithoutEndpoints(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	last := addEvents(t, s, acme, payment.EventChargeSucceeded, 2*fanOutScan)[2*fanOutScan-1]
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Idle: true}) {
		t.Fatalf("FanOut without endpoints = %+v, %v; want idle", r, err)
	}
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{}) {
		t.Errorf("the first round with an endpoint = %+v, %v; want nothing, not again", r, err)
	}
	if !pastPosition(t, s, last) {
		t.Error("the position is before the events written without endpoints")
	}
	e := addEvent(t, s, acme, payment.EventChargeSucceeded)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Created: 1}) {
		t.Errorf("FanOut of a new event = %+v, %v; want 1 created", r, err)
	}
	if got, want := deliveries(t, s), []delivery{{endpoint, e, "pending"}}; !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
}
