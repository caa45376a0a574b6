package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
	"github.com/exactlyonce/payments/internal/webhook"
)

// TestHangingMerchantDelaysNoOther: merchant A's 16 endpoints hang (each
// attempt held until the 2 s timeout) with a backlog of 10 events each, on
// a Deliverer of 32 slots, as many as A's endpoints could fill at 2 each.
// Merchant B's events, made one after another meanwhile, each arrive
// within a second; A never leases more than its half of the slots, and its
// endpoints hold one attempt at a time once they have failed.
func TestHangingMerchantDelaysNoOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var (
		mu     sync.Mutex
		hung   int
		leased int // the most of A's deliveries leased at once
	)
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hung++
		mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for handlers

	arrived := map[string]time.Time{}
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if _, seen := arrived[r.Header.Get(webhook.EventIDHeader)]; !seen {
			arrived[r.Header.Get(webhook.EventIDHeader)] = time.Now()
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(healthy.Close)

	const endpoints = 16
	for range endpoints {
		endpoint(t, b.store, b.merchant, hanging.URL, payment.AllEvents)
	}
	for range 10 {
		event(t, b.store, b.merchant, payment.EventChargeSucceeded)
	}
	other := newMerchant(t, b.store)
	endpoint(t, b.store, other, healthy.URL, payment.AllEvents)
	start(t, b.store, webhook.Options{InFlight: 32, PerEndpoint: 2, Timeout: 2 * time.Second})
	waitFor(t, "A's endpoints hold attempts", func() bool { mu.Lock(); defer mu.Unlock(); return hung > 0 })

	made := map[string]time.Time{}
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		made[event(t, b.store, other, payment.EventChargeSucceeded)] = time.Now()
		var n int
		if err := b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries
WHERE merchant_id = $1 AND lease_until > now()`, b.merchant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		leased = max(leased, n)
	}
	waitFor(t, "B has every event", func() bool { mu.Lock(); defer mu.Unlock(); return len(arrived) >= len(made) })
	mu.Lock()
	defer mu.Unlock()
	var worst time.Duration
	for id, at := range made {
		worst = max(worst, arrived[id].Sub(at))
	}
	t.Logf("B: %d events, the slowest arrived %s after it was made; A held at most %d leases at once", len(made), worst, leased)
	if worst > time.Second {
		t.Errorf("B's slowest event arrived %s after it was made; want within 1s", worst)
	}
	if leased > 16 {
		t.Errorf("A's endpoints held %d leases at once; want at most 16 of the 32", leased)
	}
	if n := len(webhooktest.Attempts(t, b.store.Pool(), hangingEndpoint(t, b))); n == 0 {
		t.Error("no attempt of A's recorded: the test proves nothing")
	}
}

// hangingEndpoint is the merchant's first endpoint.
func hangingEndpoint(t *testing.T, b bundle) (id [16]byte) {
	t.Helper()
	if err := b.store.Pool().QueryRow(context.Background(),
		`SELECT id FROM webhook_endpoints WHERE merchant_id = $1 ORDER BY created_at, id LIMIT 1`, b.merchant).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestHugeHeadersFailTheAttempt: an endpoint answering 200 with a megabyte
// of headers has its attempt recorded as failed, with an error that says
// why: the Deliverer reads no more than 16 KiB of them.
func TestHugeHeadersFailTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	huge := strings.Repeat("x", 1<<20)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Huge", huge)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rcv.Close)
	e := endpoint(t, b.store, b.merchant, rcv.URL, payment.AllEvents)
	event(t, b.store, b.merchant, payment.EventChargeSucceeded)
	start(t, b.store, webhook.Options{Timeout: 2 * time.Second, Backoff: func(int) time.Duration { return time.Hour }})
	waitFor(t, "the attempt is recorded", func() bool { return len(webhooktest.Attempts(t, b.store.Pool(), e.ID)) > 0 })
	a := webhooktest.Attempts(t, b.store.Pool(), e.ID)[0]
	if a.Status != 0 || a.Error != "answered with headers over 16 KiB" {
		t.Errorf("attempt %+v, want the error that names the headers' bound", a)
	}
}
