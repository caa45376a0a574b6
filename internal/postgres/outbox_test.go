package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestOutboxLease: one process at a time holds the lease; a quiet wait is not
// an error (the relay polls anyway), but a lease whose connection died is, so
// that the relay takes the lease up again.
func TestOutboxLease(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.NewDatabase(t))
	lease, err := s.ClaimOutbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	if _, err := s.ClaimOutbox(ctx); !errors.Is(err, payment.ErrNotLeader) {
		t.Fatalf("a second claim: %v, want ErrNotLeader", err)
	}

	if err := lease.Wait(ctx, 50*time.Millisecond); err != nil {
		t.Errorf("a wait with nothing committed: %v, want nil", err)
	}

	// The lease's session ends, as when its connection drops: the backend
	// holding the outbox's advisory lock ("paymoutb") is terminated.
	var terminated int
	if err := s.Pool().QueryRow(ctx, `
SELECT count(pg_terminate_backend(pid)) FROM pg_locks
WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (classid::bigint << 32 | objid::bigint) = $1`, int64(0x7061796d_6f757462)).Scan(&terminated); err != nil || terminated != 1 {
		t.Fatalf("terminated %d sessions holding the lease (%v), want 1", terminated, err)
	}
	if err := lease.Wait(ctx, 10*time.Second); !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("a wait on a dead lease: %v, want ErrUnavailable", err)
	}
	// The lock went with the session: another process may lead now.
	next, err := s.ClaimOutbox(ctx)
	if err != nil {
		t.Fatalf("claim after the leader's session ended: %v", err)
	}
	next.Close()
}

// TestBacklog reports the unpublished events and the age of the oldest, which
// the metrics export as the relay's lag; a Monitor reads the same on its own
// connection.
func TestBacklog(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	mon, err := postgres.OpenMonitor(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mon.Close)
	if n, age, err := s.Backlog(ctx); err != nil || n != 0 || age != 0 {
		t.Fatalf("empty outbox: %d events, oldest %v, %v; want 0, 0", n, age, err)
	}
	merchant, _, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b"} {
		_, err := testkit.Execute(ctx, s, idempotency.Request{MerchantID: merchant, Key: key},
			func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
				_, err := l.CreateAccount(ctx, merchant, payment.NewAccount{Currency: "USD"})
				return idempotency.Response{Status: 201, Body: []byte(`{}`)}, err
			})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE events SET created_at = now() - interval '90 minutes'
WHERE id = (SELECT id FROM events ORDER BY created_at LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	n, age, err := s.Backlog(ctx)
	if err != nil || n != 2 || age < 90*time.Minute || age > 91*time.Minute {
		t.Errorf("Backlog = %d events, oldest %v, %v; want 2, 90 minutes", n, age, err)
	}
	st, err := mon.Outbox(ctx)
	if err != nil || st.Backlog != 2 || st.Oldest < 90*time.Minute || st.Oldest > 91*time.Minute || st.Held != 0 || st.Holder != nil {
		t.Errorf("Monitor.Outbox = %+v, %v; want 2 events, the oldest 90 minutes old, none held", st, err)
	}

	if _, err := s.Pool().Exec(ctx, `UPDATE outbox_cursor SET (tx_id, seq) = (SELECT tx_id, seq FROM events ORDER BY tx_id DESC, seq DESC LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	if n, age, err := s.Backlog(ctx); err != nil || n != 0 || age != 0 {
		t.Errorf("all published: %d events, oldest %v, %v; want 0, 0", n, age, err)
	}
}
