package postgres

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
)

// lifecycle is a test's store with helpers to read an endpoint's row and
// its deliveries straight from the tables.
type lifecycle struct {
	t *testing.T
	s *Store
}

func (l lifecycle) update(merchant, endpoint uuid.UUID, u payment.WebhookEndpointUpdate) (e payment.WebhookEndpoint, err error) {
	l.t.Helper()
	err = l.s.DB.inTx(context.Background(), func(tx pgx.Tx) error {
		e, err = updateEndpoint(context.Background(), tx, merchant, endpoint, u)
		return err
	})
	return e, err
}

// endpointRow is the endpoint's row as stored: what an update may change,
// and its cursor.
type endpointRow struct {
	url, status         string
	events              []string
	cursorTx, cursorSeq int64
}

func (l lifecycle) row(endpoint uuid.UUID) endpointRow {
	l.t.Helper()
	var r endpointRow
	if err := l.s.Pool().QueryRow(context.Background(), `SELECT url, status, events, cursor_tx::text::bigint, cursor_seq
FROM webhook_endpoints WHERE id = $1`, endpoint).Scan(&r.url, &r.status, &r.events, &r.cursorTx, &r.cursorSeq); err != nil {
		l.t.Fatal(err)
	}
	return r
}

// states is the state of each of the endpoint's deliveries, by event.
func (l lifecycle) states(endpoint uuid.UUID) map[uuid.UUID]string {
	l.t.Helper()
	rows, _ := l.s.Pool().Query(context.Background(), `SELECT event_id, state FROM webhook_deliveries WHERE endpoint_id = $1`, endpoint)
	out := map[uuid.UUID]string{}
	var (
		event uuid.UUID
		state string
	)
	if _, err := pgx.ForEachRow(rows, []any{&event, &state}, func() error { out[event] = state; return nil }); err != nil {
		l.t.Fatal(err)
	}
	return out
}

func (l lifecycle) fanOut() {
	l.t.Helper()
	if _, err := l.s.FanOut(context.Background(), 100); err != nil {
		l.t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestWebhookEndpointUpdate: an update writes the URL and the events it is
// given and nothing else; {} writes nothing. Disabling cancels the pending
// deliveries and leaves the cursor; the events committed while disabled are
// never delivered. Enabling again moves the cursor to the event horizon and
// says the last event it passes over: the endpoint then receives exactly the
// events after that one in the feed, those of a transaction that was running
// as it was enabled included. Another merchant's or a deleted endpoint is
// not found.
func TestWebhookEndpointUpdate(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	l := lifecycle{t, s}
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	first := addEvent(t, s, acme, payment.EventChargeSucceeded)
	l.fanOut()
	created := l.row(endpoint)

	e, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{URL: ptr("https://acme.example/new"), Events: []string{payment.EventChargeSucceeded}})
	if err != nil || e.URL != "https://acme.example/new" || !slices.Equal(e.Events, []string{payment.EventChargeSucceeded}) ||
		e.Status != payment.WebhookEnabled || e.Resumed != nil || e.Secret != "" {
		t.Fatalf("update of url and events = %+v, %v", e, err)
	}
	want := created
	want.url, want.events = "https://acme.example/new", []string{payment.EventChargeSucceeded}
	if got := l.row(endpoint); !rowsEqual(got, want) {
		t.Errorf("row after updating url and events %+v, want %+v", got, want)
	}
	if e, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{}); err != nil || e.URL != want.url || e.Resumed != nil {
		t.Errorf("update {} = %+v, %v; want the endpoint unchanged", e, err)
	}
	if got := l.row(endpoint); !rowsEqual(got, want) {
		t.Errorf("row after {} %+v, want %+v", got, want)
	}

	if e, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(false)}); err != nil || e.Status != payment.WebhookDisabled || e.Resumed != nil {
		t.Fatalf("disable = %+v, %v", e, err)
	}
	want.status = payment.WebhookDisabled
	if got := l.row(endpoint); !rowsEqual(got, want) {
		t.Errorf("row after disabling %+v, want %+v (the cursor where it was)", got, want)
	}
	if got := l.states(endpoint); len(got) != 1 || got[first] != payment.DeliveryCanceled {
		t.Errorf("deliveries after disabling %v, want %s canceled", got, first)
	}
	whileDisabled := []uuid.UUID{addEvent(t, s, acme, payment.EventChargeSucceeded), addEvent(t, s, acme, payment.EventChargeSucceeded)}
	l.fanOut()

	// A transaction still running when the endpoint is enabled: its event
	// commits after, in the feed after the last event passed over.
	running, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Rollback(ctx) // a no-op once committed
	late := webhooktest.AddEvent(t, running, acme, payment.EventChargeSucceeded)
	e, err = l.update(acme, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(true)})
	if err != nil || e.Status != payment.WebhookEnabled || e.Resumed == nil || e.Resumed.After != whileDisabled[1] {
		t.Fatalf("enable = %+v (resumed %+v), %v; want it to resume after %s", e, e.Resumed, err, whileDisabled[1])
	}
	if got := l.row(endpoint); got.status != payment.WebhookEnabled || got.cursorSeq != 0 || got.cursorTx <= created.cursorTx {
		t.Errorf("row after enabling %+v, want enabled with its cursor at a later horizon than %d", got, created.cursorTx)
	}
	if err := running.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := addEvent(t, s, acme, payment.EventChargeSucceeded)
	l.fanOut()
	feed, err := s.Events(ctx, acme, payment.EventQuery{Limit: 100, StartingAfter: &e.Resumed.After})
	if err != nil {
		t.Fatal(err)
	}
	var fed []uuid.UUID
	for _, ev := range feed.Items {
		fed = append(fed, ev.ID)
	}
	wantStates := map[uuid.UUID]string{first: payment.DeliveryCanceled, late: payment.DeliveryPending, after: payment.DeliveryPending}
	if got := l.states(endpoint); !maps.Equal(got, wantStates) || !slices.Equal(fed, []uuid.UUID{late, after}) {
		t.Errorf("deliveries after enabling %v, want %v; the feed after %s: %v, want the pending ones", got, wantStates, e.Resumed.After, fed)
	}

	// Enabling an enabled endpoint changes nothing: no resumption, no move.
	before := l.row(endpoint)
	if e, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(true)}); err != nil || e.Resumed != nil {
		t.Errorf("enabling it again = %+v, %v; want no resumption", e, err)
	}
	if got := l.row(endpoint); !rowsEqual(got, before) {
		t.Errorf("row after enabling it again %+v, want %+v", got, before)
	}

	if _, err := l.update(globex, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(false)}); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("another merchant's update: %v, want ErrNotFound", err)
	}
	if err := s.DeleteWebhookEndpoint(ctx, acme, endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{}); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("a deleted endpoint's update: %v, want ErrNotFound", err)
	}
}

// A merchant without events before the resumption resumes from the first.
func TestWebhookEndpointResumesFromTheFirstEvent(t *testing.T) {
	s := openStore(t, pgtest.NewDatabase(t))
	l := lifecycle{t, s}
	acme := newMerchant(t, s, "acme")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	if _, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	e, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(true)})
	if err != nil || e.Resumed == nil || e.Resumed.After != uuid.Nil {
		t.Fatalf("enable = %+v (resumed %+v), %v; want it to resume before any event", e, e.Resumed, err)
	}
	if b, err := e.MarshalJSON(); err != nil || !strings.Contains(string(b), `"resumes_after":null`) {
		t.Errorf("rendered %s, %v; want resumes_after null", b, err)
	}
}

// TestEnablingEndsLeftoverDeliveries: an endpoint disabled by its failures
// while a fan-out ran can keep a pending delivery the fan-out inserted
// meanwhile (that disabling does not wait for the fan-out). Enabling it
// again cancels that delivery, which no claim then takes: the endpoint gets
// the events from its resumption on, and none of the time it was disabled.
func TestEnablingEndsLeftoverDeliveries(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	l := lifecycle{t, s}
	acme := newMerchant(t, s, "acme")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	event := addEvent(t, s, acme, payment.EventChargeSucceeded)
	// The race's outcome: the endpoint disabled, its fan-out's delivery pending.
	if _, err := s.Pool().Exec(ctx, `UPDATE webhook_endpoints SET status = 'disabled' WHERE id = $1`, endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id) VALUES ($1, $2, $3)`,
		acme, endpoint, event); err != nil {
		t.Fatal(err)
	}
	if _, err := l.update(acme, endpoint, payment.WebhookEndpointUpdate{Enabled: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := s.Pool().QueryRow(ctx, `SELECT state FROM webhook_deliveries WHERE endpoint_id = $1 AND event_id = $2`,
		endpoint, event).Scan(&state); err != nil || state != "canceled" {
		t.Errorf("the leftover delivery is %q, %v; want canceled", state, err)
	}
	if ds, err := s.ClaimDeliveries(ctx, 32, 64, 100, time.Minute); err != nil || len(ds) != 0 {
		t.Errorf("claimed %d, %v after enabling; want none", len(ds), err)
	}
}

// TestDeleteCancelsDeliveries: deleting an endpoint cancels its pending
// deliveries, leased or not, and no other: they are never claimed, and the
// record's pruning deletes them as settled once old. A fan-out running
// across the deletion, whose deliveries the deletion cannot see yet, is
// waited for, so its deliveries are canceled too.
func TestDeleteCancelsDeliveries(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	l := lifecycle{t, s}
	acme := newMerchant(t, s, "acme")
	gone, kept := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, acme, payment.AllEvents)
	events := []uuid.UUID{addEvent(t, s, acme, payment.EventChargeSucceeded), addEvent(t, s, acme, payment.EventChargeSucceeded),
		addEvent(t, s, acme, payment.EventChargeSucceeded)}
	l.fanOut()
	exec := func(q pgx.Tx, sql string, args ...any) {
		t.Helper()
		var err error
		if q != nil {
			_, err = q.Exec(ctx, sql, args...)
		} else {
			_, err = s.Pool().Exec(ctx, sql, args...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	exec(nil, `UPDATE webhook_deliveries SET state = 'delivered' WHERE endpoint_id = $1 AND event_id = $2`, gone, events[0])
	exec(nil, `UPDATE webhook_deliveries SET lease_until = now() + interval '1 minute', claim = gen_random_uuid()
WHERE endpoint_id = $1 AND event_id = $2`, gone, events[1])

	// A fan-out in flight: it holds its lock and has written a delivery
	// of a fourth event to the endpoint, not yet committed.
	fanOut, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer fanOut.Rollback(ctx) // a no-op once committed
	fourth := addEvent(t, s, acme, payment.EventChargeSucceeded)
	exec(fanOut, `SELECT pg_advisory_xact_lock($1)`, int64(fanOutLockKey))
	exec(fanOut, `INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id) VALUES ($1, $2, $3)`, acme, gone, fourth)
	deleted := make(chan error, 1)
	go func() { deleted <- s.DeleteWebhookEndpoint(ctx, acme, gone) }()
	select {
	case err := <-deleted:
		t.Fatalf("the deletion did not wait for the fan-out in flight: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := fanOut.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}

	wantGone := map[uuid.UUID]string{events[0]: payment.DeliveryDelivered, events[1]: payment.DeliveryCanceled,
		events[2]: payment.DeliveryCanceled, fourth: payment.DeliveryCanceled}
	wantKept := map[uuid.UUID]string{events[0]: payment.DeliveryPending, events[1]: payment.DeliveryPending, events[2]: payment.DeliveryPending}
	if got := l.states(gone); !maps.Equal(got, wantGone) {
		t.Errorf("the deleted endpoint's deliveries %v, want %v", got, wantGone)
	}
	if got := l.states(kept); !maps.Equal(got, wantKept) {
		t.Errorf("the other endpoint's deliveries %v, want %v", got, wantKept)
	}
	var canceled, leased int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'canceled'), count(*) FILTER (WHERE lease_until IS NOT NULL)
FROM webhook_deliveries WHERE endpoint_id = $1`, gone).Scan(&canceled, &leased); err != nil || canceled != 3 || leased != 0 {
		t.Errorf("%d canceled, %d leased (%v); want 3 and none", canceled, leased, err)
	}

	claimed, err := s.ClaimDeliveries(ctx, 4, 32, 32, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range claimed {
		if d.EndpointID != kept {
			t.Errorf("claimed %s of the deleted endpoint", d.EventID)
		}
	}
	if len(claimed) != 3 {
		t.Errorf("claimed %d, want the other endpoint's 3", len(claimed))
	}

	exec(nil, `UPDATE webhook_deliveries SET created_at = now() - interval '48 hours'`)
	if _, _, err := s.PruneWebhooks(ctx, 24*time.Hour, 100); err != nil {
		t.Fatal(err)
	}
	if got := l.states(gone); len(got) != 0 {
		t.Errorf("after pruning, the deleted endpoint's deliveries %v, want none", got)
	}
	if got := l.states(kept); len(got) != 3 {
		t.Errorf("after pruning, the other endpoint's deliveries %v, want its 3 pending", got)
	}
}

func rowsEqual(a, b endpointRow) bool {
	return a.url == b.url && a.status == b.status && slices.Equal(a.events, b.events) && a.cursorTx == b.cursorTx && a.cursorSeq == b.cursorSeq
}
