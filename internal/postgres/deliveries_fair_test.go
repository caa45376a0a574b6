package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestClaimsTakeTurnsAcrossMerchants: with one merchant's backlog of 120
// due deliveries on four endpoints and another merchant's single one,
// claims released at once from 8 goroutines never lease the first
// merchant more than its bound, and the first claim of all, with room for
// 5, takes the other merchant's delivery: merchants take turns.
func TestClaimsTakeTurnsAcrossMerchants(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	for range 4 {
		addEndpoint(t, s, acme, payment.AllEvents)
	}
	addEndpoint(t, s, globex, payment.AllEvents)
	for range 30 {
		addEvent(t, s, acme, payment.EventChargeSucceeded)
	}
	addEvent(t, s, globex, payment.EventChargeSucceeded)
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 121 {
		t.Fatalf("FanOut = %d, %v; want 121", n, err)
	}

	const perMerchant = 8
	first, err := s.ClaimDeliveries(ctx, 32, perMerchant, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if per := perMerchantCount(first); len(first) != 5 || per[globex] != 1 || per[acme] != 4 {
		t.Errorf("the first claim of 5 took %v of %d; want globex's 1 and 4 of acme's", per, len(first))
	}

	got := append(first, claimAtOnce(t, s, 8, 32, perMerchant)...)
	if per := perMerchantCount(got); per[acme] != perMerchant || per[globex] != 1 {
		t.Errorf("leased per merchant %v; want acme at its bound %d and globex 1", per, perMerchant)
	}
	var leased int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE lease_until > now()`).Scan(&leased); err != nil || leased != perMerchant+1 {
		t.Errorf("%d deliveries leased, %v; want %d", leased, err, perMerchant+1)
	}
}

func perMerchantCount(ds []payment.WebhookDelivery) map[uuid.UUID]int {
	per := map[uuid.UUID]int{}
	for _, d := range ds {
		per[d.MerchantID]++
	}
	return per
}

// TestFailingEndpointIsProbed: an endpoint whose attempts fail is paused as
// the Deliverer says, and then gets one attempt at a time, whatever its
// backlog, until a 2xx; 2xx answers then grow its in-flight limit, up to
// the Deliverer's bound.
func TestFailingEndpointIsProbed(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	endpoint := addEndpoint(t, s, acme, payment.AllEvents)
	for range 20 {
		addEvent(t, s, acme, payment.EventChargeSucceeded)
	}
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 20 {
		t.Fatalf("FanOut = %d, %v; want 20", n, err)
	}
	claim := func(want int) []payment.WebhookDelivery {
		t.Helper()
		ds, err := s.ClaimDeliveries(ctx, 32, 64, 100, time.Minute)
		if err != nil || len(ds) != want {
			t.Fatalf("claimed %d, %v; want %d", len(ds), err, want)
		}
		return ds
	}
	health := func() (failures, limit int, paused bool) {
		t.Helper()
		if err := s.Pool().QueryRow(ctx, `SELECT failures, in_flight_limit, coalesce(paused_until > now(), false)
FROM webhook_endpoints WHERE id = $1`, endpoint).Scan(&failures, &limit, &paused); err != nil {
			t.Fatal(err)
		}
		return failures, limit, paused
	}
	record := func(ds []payment.WebhookDelivery, a payment.WebhookAttempt) {
		t.Helper()
		outcomes := make([]payment.WebhookOutcome, len(ds))
		for i, d := range ds {
			a.At = time.Now()
			outcomes[i] = payment.WebhookOutcome{Delivery: d, Attempt: a}
		}
		if _, err := s.RecordAttempts(ctx, outcomes); err != nil {
			t.Fatal(err)
		}
	}

	// A new endpoint has 4 in flight; all four fail in one record.
	ds := claim(4)
	record(ds, payment.WebhookAttempt{Error: "no answer within 10s", RetryIn: time.Hour, RetryFor: time.Hour, PauseFor: time.Hour, InFlightUpTo: 32})
	if f, l, p := health(); f != 4 || l != 2 || !p {
		t.Errorf("after 4 failures: failures %d, limit %d, paused %v; want 4, 2, paused", f, l, p)
	}
	claim(0) // paused, with 16 due
	if _, err := s.Pool().Exec(ctx, `UPDATE webhook_endpoints SET paused_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	probe := claim(1)
	claim(0) // the probe is in flight
	record(probe, payment.WebhookAttempt{Status: 204, InFlightUpTo: 32})
	if f, l, p := health(); f != 0 || l != 3 || p {
		t.Errorf("after the probe's 2xx: failures %d, limit %d, paused %v; want 0, 3, not paused", f, l, p)
	}
	ds = claim(3)
	record(ds, payment.WebhookAttempt{Status: 200, InFlightUpTo: 5})
	if f, l, _ := health(); f != 0 || l != 5 {
		t.Errorf("after 3 more: failures %d, limit %d; want 0 and the bound 5", f, l)
	}

	// Failing again, then updated by its merchant: it starts afresh.
	ds = claim(5)
	record(ds[:1], payment.WebhookAttempt{Status: 503, RetryIn: time.Hour, RetryFor: time.Hour, PauseFor: time.Hour, InFlightUpTo: 32})
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op once committed
	url := "http://127.0.0.1:2/fixed"
	if _, err := updateEndpoint(ctx, tx, acme, endpoint, payment.WebhookEndpointUpdate{URL: &url}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if f, l, p := health(); f != 0 || l != 4 || p {
		t.Errorf("after an update: failures %d, limit %d, paused %v; want 0, 4, not paused", f, l, p)
	}
}

// TestFanOutLeases: a fan-out leases its caller the deliveries it creates
// within the bounds a claim keeps (each endpoint's in-flight limit, the
// merchant's bound, the caller's free slots), none of an endpoint whose
// attempts fail, and returns them ready to send; a claim then takes only
// what is left within the bounds.
func TestFanOutLeases(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	healthy, failing := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, acme, payment.AllEvents)
	wide := addEndpoint(t, s, globex, payment.AllEvents)
	if _, err := s.Pool().Exec(ctx, `UPDATE webhook_endpoints SET failures = 1 WHERE id = $1`, failing); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE webhook_endpoints SET in_flight_limit = 32 WHERE id = $1`, wide); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		addEvent(t, s, acme, payment.EventChargeSucceeded)
		addEvent(t, s, globex, payment.EventChargeSucceeded)
	}
	r, leased, err := s.FanOutAndLease(ctx, 100, payment.FanOutLease{PerEndpoint: 32, PerMerchant: 3, Total: 100, For: time.Minute})
	if err != nil || r.Created != 30 || r.Leased != len(leased) {
		t.Fatalf("FanOutAndLease = %+v, %d leased, %v; want 30 created, as many leased as returned", r, len(leased), err)
	}
	per := map[uuid.UUID]int{}
	for _, d := range leased {
		per[d.EndpointID]++
		if d.Attempt != 1 || d.URL == "" || len(d.Body) == 0 || d.EndpointFailures != 0 {
			t.Errorf("leased %+v, want attempt 1 with its endpoint and body", d)
		}
	}
	// acme: its healthy endpoint's 4 would fit, but acme's bound is 3.
	if per[healthy] != 3 || per[failing] != 0 || per[wide] != 3 {
		t.Errorf("leased per endpoint: healthy %d, failing %d, globex's %d; want 3, 0, 3", per[healthy], per[failing], per[wide])
	}
	claimed, err := s.ClaimDeliveries(ctx, 32, 4, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	per = map[uuid.UUID]int{}
	for _, d := range claimed {
		per[d.EndpointID]++
	}
	if per[healthy]+per[failing] != 1 || per[failing] > 1 || per[wide] != 1 {
		t.Errorf("then claimed per endpoint: healthy %d, failing %d, globex's %d; want one more each merchant, the failing at most its probe",
			per[healthy], per[failing], per[wide])
	}

	// The caller's free slots bound it too.
	for range 5 {
		addEvent(t, s, globex, payment.EventChargeSucceeded)
	}
	if _, leased, err := s.FanOutAndLease(ctx, 100, payment.FanOutLease{PerEndpoint: 32, PerMerchant: 64, Total: 2, For: time.Minute}); err != nil || len(leased) != 2 {
		t.Errorf("with 2 free slots leased %d, %v; want 2", len(leased), err)
	}
}
