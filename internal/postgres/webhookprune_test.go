package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
)

// mustExec runs sql on s's pool, failing the test on an error.
func mustExec(t *testing.T, s *Store, sql string, args ...any) {
	t.Helper()
	if _, err := s.Pool().Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// TestPruneWebhooks: attempts and deliveries older than the retention are
// deleted, but a delivery still pending to a live enabled endpoint; the
// deliveries a deleted endpoint's deletion canceled go. Recent rows stay. A
// full batch asks for more; a prune that finds the lock taken deletes
// nothing.
func TestPruneWebhooks(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme := newMerchant(t, s, "acme")
	live, gone := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, acme, payment.AllEvents)
	events := make([]uuid.UUID, 4)
	for i := range events {
		events[i] = addEvent(t, s, acme, payment.EventChargeSucceeded)
	}
	if r, err := s.FanOut(ctx, 100); err != nil || r.Created != 8 {
		t.Fatalf("FanOut = %+v, %v; want 8 created", r, err)
	}
	if err := s.DeleteWebhookEndpoint(ctx, acme, gone); err != nil {
		t.Fatal(err)
	}
	// The live endpoint's deliveries: delivered and old, pending and old,
	// delivered and recent, abandoned and old. The deleted endpoint's,
	// canceled, all old. Five attempts: three old, two recent.
	exec := func(sql string, args ...any) { t.Helper(); mustExec(t, s, sql, args...) }
	exec(`UPDATE webhook_deliveries SET created_at = now() - interval '48 hours'`)
	exec(`UPDATE webhook_deliveries d SET state = x.state, created_at = now() - x.age::interval
FROM (SELECT e.id, s.state, s.age, s.n FROM events e JOIN (VALUES
    (1, 'delivered', '48 hours'), (2, 'pending', '48 hours'), (3, 'delivered', '1 hour'), (4, 'abandoned', '48 hours')
) s(n, state, age) ON e.id = ($2::uuid[])[s.n]) x
WHERE d.endpoint_id = $1 AND d.event_id = x.id`, live, events)
	for i, age := range []string{"48 hours", "30 hours", "25 hours", "1 hour", "0 hours"} {
		exec(`INSERT INTO webhook_attempts (merchant_id, endpoint_id, id, event_id, attempted_at, status, latency_ms)
VALUES ($1, $2, $3, $4, now() - $5::interval, 500, 1)`, acme, live, payment.NewID(), events[i%4], age)
	}

	// Another prune holds the lock: this one deletes nothing.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(webhookPruneLockKey)); err != nil {
		t.Fatal(err)
	}
	if n, more, err := s.PruneWebhooks(ctx, 24*time.Hour, 100); err != nil || n != 0 || more {
		t.Errorf("PruneWebhooks while another holds the lock = %d, %v, %v; want 0, false, nil", n, more, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// 3 attempts and 6 settled deliveries are to go. In batches of 2, both
	// batches are full: more is due; the next prune takes the rest.
	if n, more, err := s.PruneWebhooks(ctx, 24*time.Hour, 2); err != nil || n != 4 || !more {
		t.Errorf("PruneWebhooks in batches of 2 = %d, %v, %v; want 4 deleted, more", n, more, err)
	}
	if n, more, err := s.PruneWebhooks(ctx, 24*time.Hour, 100); err != nil || n != 5 || more {
		t.Errorf("the next PruneWebhooks = %d, %v, %v; want 5 deleted, no more", n, more, err)
	}
	want := sortDeliveries([]delivery{{live, events[1], "pending"}, {live, events[2], "delivered"}})
	if got := deliveries(t, s); !slices.Equal(got, want) {
		t.Errorf("deliveries left %v, want the old pending one of the live endpoint and the recent one: %v", got, want)
	}
	var attempts int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM webhook_attempts WHERE attempted_at > now() - interval '24 hours'`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	var all int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM webhook_attempts`).Scan(&all); err != nil || all != 2 || attempts != 2 {
		t.Errorf("attempts left: %d, %d of them recent (%v); want the 2 recent ones", all, attempts, err)
	}
}

// TestPruneWebhooksGoesPastPending: the oldest deliveries, more than a batch
// of them, are pending to one merchant's live endpoint; another merchant's
// settled deliveries, attempts, and deliveries still pending to its deleted
// endpoint behind them are pruned all the same, in one pass (the calls until
// the last says no more, as the Deliverer makes them), and the pending ones
// to the live endpoint stay.
func TestPruneWebhooksGoesPastPending(t *testing.T) {
	const batch = 2
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	failing, settled := addEndpoint(t, s, acme, payment.AllEvents), addEndpoint(t, s, globex, payment.AllEvents)
	dropped := addEndpoint(t, s, globex, payment.AllEvents)
	var acmes, globexes []uuid.UUID
	for range 5 {
		acmes = append(acmes, addEvent(t, s, acme, payment.EventChargeSucceeded))
	}
	for range 3 {
		globexes = append(globexes, addEvent(t, s, globex, payment.EventChargeSucceeded))
	}
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 11 {
		t.Fatalf("FanOut = %d, %v; want 11", n, err)
	}
	if err := s.DeleteWebhookEndpoint(ctx, globex, dropped); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) { t.Helper(); mustExec(t, s, sql, args...) }
	// acme's pending deliveries are the oldest; globex's are delivered,
	// abandoned, and delivered an hour ago, and pending to its deleted
	// endpoint.
	exec(`UPDATE webhook_deliveries SET created_at = now() - interval '50 hours' WHERE endpoint_id = $1`, failing)
	// Deletion cancels an endpoint's pending deliveries; these stand for any
	// left pending to an endpoint no longer live, which must go as well.
	exec(`UPDATE webhook_deliveries SET state = 'pending', created_at = now() - interval '48 hours' WHERE endpoint_id = $1`, dropped)
	exec(`UPDATE webhook_deliveries d SET state = x.state, created_at = now() - x.age::interval
FROM (SELECT e.id, s.state, s.age FROM events e JOIN (VALUES
    (1, 'delivered', '48 hours'), (2, 'abandoned', '48 hours'), (3, 'delivered', '1 hour')
) s(n, state, age) ON e.id = ($2::uuid[])[s.n]) x
WHERE d.endpoint_id = $1 AND d.event_id = x.id`, settled, globexes)
	for _, a := range []struct {
		merchant, endpoint, event uuid.UUID
		age                       string
		status                    int
	}{
		{acme, failing, acmes[0], "49 hours", 500},
		{globex, settled, globexes[0], "48 hours", 204},
		{globex, settled, globexes[1], "48 hours", 500},
		{globex, settled, globexes[2], "1 hour", 200},
	} {
		exec(`INSERT INTO webhook_attempts (merchant_id, endpoint_id, id, event_id, attempted_at, status, latency_ms)
VALUES ($1, $2, $3, $4, now() - $5::interval, $6, 1)`, a.merchant, a.endpoint, payment.NewID(), a.event, a.age, a.status)
	}

	var deleted int64
	for calls := 1; ; calls++ {
		n, more, err := s.PruneWebhooks(ctx, 24*time.Hour, batch)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		if !more || calls > 100 {
			break
		}
	}
	if deleted != 8 {
		t.Errorf("a pass in batches of %d deleted %d rows, want 8 (3 attempts, globex's 2 settled and 3 dropped deliveries)", batch, deleted)
	}
	var want []delivery
	for _, e := range acmes {
		want = append(want, delivery{failing, e, "pending"})
	}
	want = sortDeliveries(append(want, delivery{settled, globexes[2], "delivered"}))
	if got := deliveries(t, s); !slices.Equal(got, want) {
		t.Errorf("deliveries left %v,\nwant acme's pending ones and globex's recent one: %v", got, want)
	}
	if got, want := webhooktest.Attempts(t, s.Pool(), settled), []webhooktest.Attempt{{Status: 200}}; !slices.Equal(got, want) ||
		len(webhooktest.Attempts(t, s.Pool(), failing)) != 0 {
		t.Errorf("attempts left: globex's %v, acme's %v; want globex's recent one only", got, webhooktest.Attempts(t, s.Pool(), failing))
	}
}
