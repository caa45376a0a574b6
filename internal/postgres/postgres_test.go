package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"payments/internal/idempotency"
	"payments/internal/payment"
	"payments/internal/pgtest"
	"payments/internal/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, url string) *postgres.Store {
	t.Helper()
	// Registered first, so it runs last: once the store is closed, its pool
	// and its notifier goroutine must be gone.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	s, err := postgres.Open(context.Background(), url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestJanitorDeletesOnlyExpiredKeysInBatches fills a database with expired and
// live keys: a sweep removes exactly the expired ones, in bounded batches, and
// a second janitor stands aside while the first holds the lock.
func TestJanitorDeletesOnlyExpiredKeysInBatches(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.NewDatabase(t))
	merchant := uuid.New()
	_, err := s.Pool().Exec(ctx, `
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, body, created_at)
SELECT $1::uuid, 'old-' || g, '\x00'::bytea, 201, '{}'::bytea, now() - interval '25 hours' FROM generate_series(1, 2500) g
UNION ALL
SELECT $1::uuid, 'live-' || g, '\x00'::bytea, 201, '{}'::bytea, now() - interval '23 hours' FROM generate_series(1, 300) g`, merchant)
	if err != nil {
		t.Fatal(err)
	}

	// While another transaction holds the janitor lock, a janitor does nothing.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(0x7061796d_6a616e69)); err != nil {
		t.Fatal(err)
	}
	if n, ran, err := s.DeleteExpiredKeys(ctx, 24*time.Hour, 1000); err != nil || ran || n != 0 {
		t.Errorf("with the lock taken: deleted %d, ran %v, %v", n, ran, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	j := idempotency.NewJanitor(s, slog.New(slog.NewTextHandler(io.Discard, nil)), 24*time.Hour, time.Hour, 1000, time.Millisecond)
	if n := j.Sweep(ctx); n != 2500 {
		t.Errorf("swept %d keys, want 2500", n)
	}
	var old, live int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE key LIKE 'old-%'), count(*) FILTER (WHERE key LIKE 'live-%') FROM idempotency_keys`).Scan(&old, &live); err != nil {
		t.Fatal(err)
	}
	if old != 0 || live != 300 {
		t.Errorf("%d expired and %d live keys left, want 0 and 300", old, live)
	}
}

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.DatabaseURL(t))
	id, key, err := s.CreateMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second answer comes from the cache
		if got, err := s.Authenticate(ctx, key); err != nil || got != id {
			t.Errorf("Authenticate = %v, %v; want %v", got, err, id)
		}
	}
	if _, err := s.Authenticate(ctx, key+"x"); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Errorf("a wrong key: %v", err)
	}
	var stored []byte
	if err := s.Pool().QueryRow(ctx, `SELECT hash FROM api_keys WHERE merchant_id = $1`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 32 || string(stored) == key {
		t.Error("the API key is not stored as a SHA-256 hash")
	}
}
