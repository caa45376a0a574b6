package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestPruneWebhooks: attempts and deliveries older than the retention are
// deleted, but a delivery still pending to a live enabled endpoint; a pending
// delivery of a deleted endpoint goes. Recent rows stay. A full batch asks
// for more; a prune that finds the lock taken deletes nothing.
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
	// delivered and recent, abandoned and old. The deleted endpoint's stay
	// pending, all old. Five attempts: three old, two recent.
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := s.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
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

	// 3 attempts and 6 deliveries are to go. In batches of 2, both batches
	// are full (the oldest deliveries are the deleted endpoint's): more is
	// due; the next prune takes the rest.
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
