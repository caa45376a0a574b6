package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"testing"
	"time"

	"payments/internal/payment"
	"payments/internal/pgtest"
)

// TestAuthCache: a known API key is answered from memory, without asking the
// database, until its entry expires; then the database decides again. The
// cache never holds more than authCacheMax keys.
func TestAuthCache(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DatabaseURL(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	id, key, err := s.CreateMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Authenticate(ctx, key); err != nil || got != id {
		t.Fatalf("Authenticate = %v, %v; want %v", got, err, id)
	}

	// The key is revoked in the table: within its TTL the cached entry answers.
	if _, err := s.Pool().Exec(ctx, `DELETE FROM api_keys WHERE merchant_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Authenticate(ctx, key); err != nil || got != id {
		t.Errorf("within the cache's TTL: Authenticate = %v, %v; want %v from the cache", got, err, id)
	}
	// Past it, the table's answer: the key is unknown.
	hash := sha256.Sum256([]byte(key))
	s.auth.mu.Lock()
	e := s.auth.entries[hash]
	e.expires = time.Now().Add(-time.Millisecond)
	s.auth.entries[hash] = e
	s.auth.mu.Unlock()
	if got, err := s.Authenticate(ctx, key); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Errorf("after the entry expired: Authenticate = %v, %v; want ErrUnauthenticated", got, err)
	}

	// Bounded: full, it starts over rather than grow.
	var c authCache
	for i := range authCacheMax {
		c.put(sha256.Sum256([]byte(strconv.Itoa(i))), id)
	}
	if len(c.entries) != authCacheMax {
		t.Fatalf("%d entries after %d keys", len(c.entries), authCacheMax)
	}
	c.put(sha256.Sum256([]byte("one more")), id)
	if len(c.entries) != 1 {
		t.Errorf("%d entries after one key more than the %d allowed, want 1 (started over)", len(c.entries), authCacheMax)
	}
}
