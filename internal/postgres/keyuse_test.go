package postgres

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestKeyUseDelaysNoRequest: a request whose key's last use is due to be
// written is answered while another transaction holds the key's row locked (as
// a commit waiting for a standby that stopped confirming would hold it),
// instead of waiting for the lock until lock_timeout and answering 503; the
// last use is written once the row is free.
func TestKeyUseDelaysNoRequest(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.NewDatabase(t), Options{KeyWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	merchant, key, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE api_keys SET last_used_at = now() - interval '2 minutes' WHERE merchant_id = $1`, merchant); err != nil {
		t.Fatal(err)
	}
	locker, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) // a no-op once committed below
	if _, err := locker.Exec(ctx, `SELECT FROM api_keys WHERE merchant_id = $1 FOR UPDATE`, merchant); err != nil {
		t.Fatal(err)
	}
	used := time.Now()
	if got, err := s.Authenticate(ctx, key.Secret, "test"); err != nil || got != merchant {
		t.Fatalf("Authenticate with the key's row locked = %v, %v; want %v at once", got, err, merchant)
	}
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitLastUse(t, s, key.Secret, used)
}

// waitLastUse waits until the key's last use is written at or after since
// (less a second of clock between here and the database).
func waitLastUse(t *testing.T, s *Store, secret string, since time.Time) {
	t.Helper()
	hash := sha256.Sum256([]byte(secret))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var last *time.Time
		if err := s.Pool().QueryRow(context.Background(),
			`SELECT last_used_at FROM api_keys WHERE hash = $1`, hash[:]).Scan(&last); err != nil {
			t.Fatal(err)
		}
		if last != nil && last.After(since.Add(-time.Second)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last use is %v 10 s after a use at %v", last, since)
		}
	}
}
