package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
)

// addEvent writes an event of the merchant, without the money movement
// behind it.
func addEvent(t *testing.T, s *Store, merchant uuid.UUID, eventType string) uuid.UUID {
	t.Helper()
	return webhooktest.AddEvent(t, s.Pool(), merchant, eventType)
}

func addEndpoint(t testing.TB, s *Store, merchant uuid.UUID, events ...string) uuid.UUID {
	t.Helper()
	e, err := s.CreateWebhookEndpoint(context.Background(), merchant, "http://127.0.0.1:1/hook", events, "whsec_"+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	return e.ID
}

// delivery is a row of webhook_deliveries, as the tests compare them.
type delivery struct {
	endpoint, event uuid.UUID
	state           string
}

func deliveries(t *testing.T, s *Store) []delivery {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(),
		`SELECT endpoint_id, event_id, state FROM webhook_deliveries ORDER BY endpoint_id, event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []delivery
	for rows.Next() {
		var d delivery
		if err := rows.Scan(&d.endpoint, &d.event, &d.state); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sortDeliveries(ds []delivery) []delivery {
	slices.SortFunc(ds, func(a, b delivery) int {
		if c := slices.Compare(a.endpoint[:], b.endpoint[:]); c != 0 {
			return c
		}
		return slices.Compare(a.event[:], b.event[:])
	})
	return ds
}

// TestFanOut: each live endpoint gets a delivery of each of its own
// merchant's events, from its creation on, of the types it subscribes to;
// its cursor moves past the events it does not subscribe to; a second
// fan-out, or one in small batches, creates no duplicate; a fan-out that
// finds the lock taken does nothing and asks to be called again.
func TestFanOut(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	addEvent(t, s, acme, payment.EventAccountCreated) // before any endpoint: never delivered
	all := addEndpoint(t, s, acme, payment.AllEvents)
	charges := addEndpoint(t, s, acme, payment.EventChargeSucceeded)
	other := addEndpoint(t, s, globex, payment.AllEvents)
	deleted := addEndpoint(t, s, acme, payment.AllEvents)
	if err := s.DeleteWebhookEndpoint(ctx, acme, deleted); err != nil {
		t.Fatal(err)
	}
	a1 := addEvent(t, s, acme, payment.EventAccountCreated)
	a2 := addEvent(t, s, acme, payment.EventChargeSucceeded)
	a3 := addEvent(t, s, acme, payment.EventChargeFailed)
	g1 := addEvent(t, s, globex, payment.EventChargeSucceeded)

	// Another fan-out holds the lock: this one does nothing.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(fanOutLockKey)); err != nil {
		t.Fatal(err)
	}
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Again: true}) {
		t.Errorf("FanOut while another holds the lock = %+v, %v; want none created, again", r, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	want := sortDeliveries([]delivery{
		{all, a1, "pending"}, {all, a2, "pending"}, {all, a3, "pending"},
		{charges, a2, "pending"},
		{other, g1, "pending"},
	})
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != len(want) {
		t.Fatalf("FanOut = %d, %v; want %d", n, err, len(want))
	}
	if got := deliveries(t, s); !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 0 {
		t.Errorf("the second FanOut = %d, %v; want 0", n, err)
	}
	// The charges-only endpoint's cursor is past a3, which it does not
	// take: the position of acme's last event.
	var behind int
	if err := s.Pool().QueryRow(ctx, `
SELECT count(*) FROM webhook_endpoints e JOIN events ev ON ev.merchant_id = e.merchant_id AND ev.id = $2
WHERE e.id = $1 AND (e.cursor_tx, e.cursor_seq) <> (ev.tx_id, ev.seq)`, charges, a3).Scan(&behind); err != nil || behind != 0 {
		t.Errorf("the charges-only endpoint's cursor is not at its merchant's last event (%d, %v)", behind, err)
	}

	// In batches of one: each call moves each cursor by one event, and the
	// deliveries come out the same.
	b1 := addEvent(t, s, acme, payment.EventChargeSucceeded)
	b2 := addEvent(t, s, acme, payment.EventRefundCreated)
	calls := 0
	for {
		n, err := created(s.FanOut(ctx, 1))
		if err != nil {
			t.Fatal(err)
		}
		if calls++; n == 0 || calls > 5 {
			break
		}
	}
	want = sortDeliveries(append(want, delivery{all, b1, "pending"}, delivery{all, b2, "pending"}, delivery{charges, b1, "pending"}))
	if got := deliveries(t, s); !slices.Equal(got, want) || calls != 3 {
		t.Errorf("after batches of one (%d calls): %v, want %v in 3 calls", calls, got, want)
	}
}

// claimAtOnce releases claimers goroutines at once, each claiming up to 100
// deliveries within the bounds, and returns all they claimed.
func claimAtOnce(t *testing.T, s *Store, claimers, perEndpoint, perMerchant int) []payment.WebhookDelivery {
	t.Helper()
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		mu    sync.Mutex
		got   []payment.WebhookDelivery
	)
	for range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ds, err := s.ClaimDeliveries(context.Background(), perEndpoint, perMerchant, 100, time.Minute)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			got = append(got, ds...)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return got
}

// TestClaimDeliveries: claims at once never take one delivery twice, nor an
// endpoint's deliveries beyond its bound; a claim returns the event as the
// feed shows it and the attempt's number; a settled delivery frees its slot.
func TestClaimDeliveries(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	first, second := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, acme, payment.AllEvents)
	for range 10 {
		addEvent(t, s, acme, payment.EventChargeSucceeded)
	}
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 20 {
		t.Fatalf("FanOut = %d, %v; want 20", n, err)
	}

	const perEndpoint = 3
	got := claimAtOnce(t, s, 8, perEndpoint, 100)
	seen := map[delivery]bool{}
	per := map[uuid.UUID]int{}
	for _, d := range got {
		k := delivery{d.EndpointID, d.EventID, ""}
		if seen[k] {
			t.Errorf("delivery %v claimed twice", k)
		}
		seen[k] = true
		per[d.EndpointID]++
	}
	if per[first] != perEndpoint || per[second] != perEndpoint {
		t.Errorf("claimed per endpoint %v, want %d each", per, perEndpoint)
	}
	if more, err := s.ClaimDeliveries(ctx, perEndpoint, 100, 100, time.Minute); err != nil || len(more) != 0 {
		t.Errorf("a claim with every endpoint at its bound = %d, %v; want none", len(more), err)
	}

	// The body is the event as /v1/events shows it.
	page, err := s.Events(ctx, acme, payment.EventQuery{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	d := got[0]
	i := slices.IndexFunc(page.Items, func(e payment.Event) bool { return e.ID == d.EventID })
	wantBody, _ := json.Marshal(page.Items[i])
	if string(d.Body) != string(wantBody) || d.Attempt != 1 || d.Secret == "" || d.URL != "http://127.0.0.1:1/hook" {
		t.Errorf("claimed %+v body %s, want attempt 1 with the endpoint and body %s", d, d.Body, wantBody)
	}

	// Delivered, it frees its endpoint's slot for one more.
	state, err := s.RecordAttempt(ctx, d, payment.WebhookAttempt{At: time.Now(), Status: 204, Latency: time.Millisecond})
	if err != nil || state != payment.DeliveryDelivered {
		t.Fatalf("RecordAttempt = %q, %v; want delivered", state, err)
	}
	more, err := s.ClaimDeliveries(ctx, perEndpoint, 100, 100, time.Minute)
	if err != nil || len(more) != 1 || more[0].EndpointID != d.EndpointID {
		t.Errorf("after a delivery: claimed %d, %v; want 1 of endpoint %s", len(more), err, d.EndpointID)
	}
}

// TestRecordAttempt: a failure schedules the next attempt; a claim whose
// lease expired and was taken by another records its attempt but settles
// nothing; a 2xx delivers; failing for the whole retry period abandons the
// delivery, disables the endpoint and abandons its other deliveries.
func TestRecordAttempt(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	event := addEvent(t, s, acme, payment.EventChargeSucceeded)
	if _, err := s.FanOut(ctx, 100); err != nil {
		t.Fatal(err)
	}
	claimOne := func(lease time.Duration) payment.WebhookDelivery {
		t.Helper()
		ds, err := s.ClaimDeliveries(ctx, 4, 32, 32, lease)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claimed %d, %v; want 1", len(ds), err)
		}
		return ds[0]
	}
	failed := func(status int, errText string) payment.WebhookAttempt {
		return payment.WebhookAttempt{At: time.Now(), Status: status, Error: errText, Latency: 5 * time.Millisecond, RetryIn: time.Hour, RetryFor: time.Hour}
	}

	stale := claimOne(time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	current := claimOne(time.Minute)
	if stale.Claim == current.Claim || current.Attempt != 1 {
		t.Fatalf("the second claim %+v, want a new token and attempt 1", current)
	}
	if state, err := s.RecordAttempt(ctx, stale, failed(0, "timeout")); err != nil || state != "" {
		t.Errorf("the expired claim's RecordAttempt = %q, %v; want nothing settled", state, err)
	}
	if state, err := s.RecordAttempt(ctx, current, failed(500, "")); err != nil || state != payment.DeliveryPending {
		t.Errorf("a 500 = %q, %v; want pending", state, err)
	}
	if ds, err := s.ClaimDeliveries(ctx, 4, 32, 32, time.Minute); err != nil || len(ds) != 0 {
		t.Errorf("claimed %d, %v before the retry is due; want none", len(ds), err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	retry := claimOne(time.Minute)
	if retry.Attempt != 2 || retry.EventID != event {
		t.Errorf("the retry %+v, want attempt 2 of the event", retry)
	}
	if state, err := s.RecordAttempt(ctx, retry, payment.WebhookAttempt{At: time.Now(), Status: 200}); err != nil || state != payment.DeliveryDelivered {
		t.Errorf("a 200 = %q, %v; want delivered", state, err)
	}
	if got, want := webhooktest.Attempts(t, s.Pool(), endpoint), []webhooktest.Attempt{{Error: "timeout"}, {Status: 500}, {Status: 200}}; !slices.Equal(got, want) {
		t.Errorf("attempts %v, want %v", got, want)
	}

	// Failing past the retry period: abandoned, with the endpoint's other
	// pending delivery, and the endpoint disabled.
	addEvent(t, s, acme, payment.EventChargeFailed)
	addEvent(t, s, acme, payment.EventChargeFailed)
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 2 {
		t.Fatalf("FanOut = %d, %v; want 2", n, err)
	}
	ds, err := s.ClaimDeliveries(ctx, 1, 32, 32, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claimed %d, %v; want 1", len(ds), err)
	}
	giveUp := failed(0, "connection refused")
	giveUp.RetryFor = 0
	if state, err := s.RecordAttempt(ctx, ds[0], giveUp); err != nil || state != payment.DeliveryAbandoned {
		t.Errorf("failing past the retry period = %q, %v; want abandoned", state, err)
	}
	var pending int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`).Scan(&pending); err != nil || pending != 0 {
		t.Errorf("%d deliveries still pending (%v), want 0", pending, err)
	}
	if e, err := s.WebhookEndpoint(ctx, acme, endpoint); err != nil || e.Status != payment.WebhookDisabled {
		t.Errorf("the endpoint %+v, %v; want disabled", e, err)
	}
	addEvent(t, s, acme, payment.EventChargeFailed)
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 0 {
		t.Errorf("FanOut to a disabled endpoint = %d, %v; want 0", n, err)
	}
}

// TestPruneSparesWebhookEvents: the relay's pruning keeps the events a live
// endpoint has yet to fan out (at or after its cursor) and those with a
// pending delivery, and prunes the others once delivered.
func TestPruneSparesWebhookEvents(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	before := addEvent(t, s, acme, payment.EventAccountCreated)
	addEndpoint(t, s, acme, payment.AllEvents)
	pending := addEvent(t, s, acme, payment.EventChargeSucceeded)
	if _, err := s.FanOut(ctx, 1); err != nil { // a delivery of pending; the cursor at it
		t.Fatal(err)
	}
	later := addEvent(t, s, acme, payment.EventChargeSucceeded) // not fanned out yet
	unwatched := addEvent(t, s, globex, payment.EventChargeSucceeded)

	lease, err := s.ClaimOutbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	prune := func() []uuid.UUID {
		t.Helper()
		events, err := lease.Unpublished(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.MarkPublished(ctx, events); err != nil {
			t.Fatal(err)
		}
		if _, _, err := lease.Prune(ctx, 0, 100); err != nil {
			t.Fatal(err)
		}
		rows, err := s.Pool().Query(ctx, `SELECT id FROM events ORDER BY tx_id, seq`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var left []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			left = append(left, id)
		}
		return left
	}
	if got, want := prune(), []uuid.UUID{pending, later}; !slices.Equal(got, want) {
		t.Errorf("after pruning: %v, want only %v (pending, later); pruned: %v, %v", got, want, before, unwatched)
	}

	// Fanned out and delivered, pending goes; later, at the cursor now,
	// stays until the cursor moves past it.
	if _, err := s.FanOut(ctx, 100); err != nil {
		t.Fatal(err)
	}
	ds, err := s.ClaimDeliveries(ctx, 4, 32, 32, time.Minute)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claimed %d, %v; want 2", len(ds), err)
	}
	for _, d := range ds {
		if _, err := s.RecordAttempt(ctx, d, payment.WebhookAttempt{At: time.Now(), Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := prune(), []uuid.UUID{later}; !slices.Equal(got, want) {
		t.Errorf("after delivering: %v, want only %v", got, want)
	}
}

// TestDeletedEndpointGetsNoMore: a deleted endpoint's pending deliveries are
// not claimed again, and it gets no new ones.
func TestDeletedEndpointGetsNoMore(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	addEvent(t, s, acme, payment.EventChargeSucceeded)
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 1 {
		t.Fatalf("FanOut = %d, %v; want 1", n, err)
	}
	if err := s.DeleteWebhookEndpoint(ctx, acme, endpoint); err != nil {
		t.Fatal(err)
	}
	if ds, err := s.ClaimDeliveries(ctx, 4, 32, 32, time.Minute); err != nil || len(ds) != 0 {
		t.Errorf("claimed %d, %v of a deleted endpoint; want none", len(ds), err)
	}
	addEvent(t, s, acme, payment.EventChargeSucceeded)
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 0 {
		t.Errorf("FanOut to a deleted endpoint = %d, %v; want 0", n, err)
	}
}

// An attempt's result fits webhook_attempts: a status, or an error, never
// both, whatever the answer was.
func TestAttemptResult(t *testing.T) {
	long := string(make([]byte, 2000))
	for _, tc := range []struct {
		name   string
		a      payment.WebhookAttempt
		status int
		err    string
	}{
		{"a 2xx", payment.WebhookAttempt{Status: 204}, 204, ""},
		{"a 500", payment.WebhookAttempt{Status: 500}, 500, ""},
		{"an error", payment.WebhookAttempt{Error: "connection refused"}, 0, "connection refused"},
		{"an error and a status", payment.WebhookAttempt{Status: 200, Error: "body cut"}, 0, "body cut"},
		{"an invalid status", payment.WebhookAttempt{Status: 999}, 0, "answered with the invalid status 999"},
		{"nothing", payment.WebhookAttempt{}, 0, "no answer"},
		{"a long error", payment.WebhookAttempt{Error: long}, 0, long[:1024]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, errText := attemptResult(tc.a)
			if (status == nil) == (errText == nil) {
				t.Fatalf("status %v, error %v: want exactly one", status, errText)
			}
			if status != nil && *status != tc.status || errText != nil && *errText != tc.err {
				t.Errorf("got %v %v, want %d %q", status, errText, tc.status, tc.err)
			}
		})
	}
}

// TestDisabledEvent: the attempt that abandons a delivery and disables its
// endpoint writes one webhook_endpoint.disabled event, whose data is the
// endpoint as GET shows it; the endpoint's other delivery, abandoned with
// it, writes none when its attempt is recorded.
func TestDisabledEvent(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	addEvent(t, s, acme, payment.EventChargeSucceeded)
	addEvent(t, s, acme, payment.EventChargeFailed)
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 2 {
		t.Fatalf("FanOut = %d, %v; want 2", n, err)
	}
	ds, err := s.ClaimDeliveries(ctx, 4, 32, 32, time.Minute)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claimed %d, %v; want 2", len(ds), err)
	}
	giveUp := payment.WebhookAttempt{At: time.Now(), Error: "connection refused", RetryIn: time.Hour}
	if state, err := s.RecordAttempt(ctx, ds[0], giveUp); err != nil || state != payment.DeliveryAbandoned {
		t.Fatalf("RecordAttempt = %q, %v; want abandoned", state, err)
	}
	if state, err := s.RecordAttempt(ctx, ds[1], giveUp); err != nil || state != "" {
		t.Errorf("the other delivery's RecordAttempt = %q, %v; want nothing settled", state, err)
	}
	var (
		n         int
		aggregate string
		id        uuid.UUID
		payload   []byte
	)
	if err := s.Pool().QueryRow(ctx, `
SELECT count(*) OVER (), aggregate_type, aggregate_id, payload FROM events WHERE merchant_id = $1 AND type = $2`,
		acme, payment.EventWebhookEndpointDisabled).Scan(&n, &aggregate, &id, &payload); err != nil || n != 1 {
		t.Fatalf("%d webhook_endpoint.disabled events (%v), want 1", n, err)
	}
	e, err := s.WebhookEndpoint(ctx, acme, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(e)
	var got, wantJSON any
	_ = json.Unmarshal(payload, &got)
	_ = json.Unmarshal(want, &wantJSON)
	if aggregate != "webhook_endpoint" || id != endpoint || e.Status != payment.WebhookDisabled ||
		fmt.Sprint(got) != fmt.Sprint(wantJSON) {
		t.Errorf("event %s %s %s, want the endpoint as GET shows it %s", aggregate, id, payload, want)
	}
}
