package postgres

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestAuthCache: a valid API key is answered from memory, without asking the
// database, for authTrust; then the database decides again. The cache never
// holds more than authCacheMax keys.
func TestAuthCache(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.DatabaseURL(t))
	id, newKey, err := s.RegisterMerchant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	key := newKey.Secret
	if got, err := s.Authenticate(ctx, key, "test"); err != nil || got != id {
		t.Fatalf("Authenticate = %v, %v; want %v", got, err, id)
	}

	// The key is deleted from the table: within its trust the cached entry answers.
	if _, err := s.Pool().Exec(ctx, `DELETE FROM api_keys WHERE merchant_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	before := s.Pool().Stat().AcquireCount()
	if got, err := s.Authenticate(ctx, key, "test"); err != nil || got != id {
		t.Errorf("within its trust: Authenticate = %v, %v; want %v from the cache", got, err, id)
	}
	if n := s.Pool().Stat().AcquireCount() - before; n != 0 {
		t.Errorf("a trusted key took %d connections, want 0", n)
	}
	// Past it, the table's answer: the key is unknown, and forgotten.
	hash := sha256.Sum256([]byte(key))
	s.auth.mu.Lock()
	e := s.auth.entries[hash]
	e.trustedUntil = time.Now().Add(-time.Millisecond)
	s.auth.entries[hash] = e
	s.auth.mu.Unlock()
	if got, err := s.Authenticate(ctx, key, "test"); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Errorf("past its trust: Authenticate = %v, %v; want ErrUnauthenticated", got, err)
	}
	if _, _, known := s.auth.get(hash, time.Now()); known {
		t.Error("a key the database no longer has is still known")
	}

	// Bounded: full, it starts over rather than grow.
	var c authCache
	for i := range authCacheMax {
		c.put(sha256.Sum256([]byte(strconv.Itoa(i))), id, time.Now())
	}
	if len(c.entries) != authCacheMax {
		t.Fatalf("%d entries after %d keys", len(c.entries), authCacheMax)
	}
	c.put(sha256.Sum256([]byte("one more")), id, time.Now())
	if len(c.entries) != 1 {
		t.Errorf("%d entries after one key more than the %d allowed, want 1 (started over)", len(c.entries), authCacheMax)
	}
}

func TestWellFormedAPIKey(t *testing.T) {
	secret := base64.RawURLEncoding.EncodeToString(make([]byte, apiKeySecretBytes))
	for _, tc := range []struct {
		name, key string
		want      bool
	}{
		{"generated shape", APIKeyPrefix + secret, true},
		{"empty", "", false},
		{"no prefix", secret + "abc", false},
		{"other prefix", "pk_" + secret, false},
		{"one short", APIKeyPrefix + secret[1:], false},
		{"one long", APIKeyPrefix + secret + "A", false},
		{"padded", APIKeyPrefix + secret[1:] + "=", false},
		{"standard alphabet", APIKeyPrefix + "+" + secret[1:], false},
		{"non-zero trailing bits", APIKeyPrefix + secret[:len(secret)-1] + "B", false},
		{"newline inside", APIKeyPrefix + secret[:20] + "\n" + secret[21:], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := wellFormedAPIKey(tc.key); got != tc.want {
				t.Errorf("wellFormedAPIKey(%q) = %t, want %t", tc.key, got, tc.want)
			}
		})
	}
	for range 100 {
		key, err := newTestKey()
		if err != nil || !wellFormedAPIKey(key) {
			t.Fatalf("a generated key %q is not well formed (%v)", key, err)
		}
	}
}

func newTestKey() (string, error) {
	s := make([]byte, apiKeySecretBytes)
	_, err := rand.Read(s)
	return APIKeyPrefix + base64.RawURLEncoding.EncodeToString(s), err
}

// openStore opens a Store on url, closed when the test ends.
func openStore(t testing.TB, url string) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestAPIKeyLifecycle: a merchant holds several keys, lists them without
// secrets, and revokes one; revoked keys are refused, the others work; the
// errors name the problem; last use is recorded at most once a minute.
func TestAPIKeyLifecycle(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.DatabaseURL(t))
	merchant, first, err := s.RegisterMerchant(ctx, "rotating")
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.CreateAPIKey(ctx, merchant)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.ID, KeyIDPrefix) || first.ID == second.ID || first.Secret == second.Secret {
		t.Fatalf("keys %+v and %+v", first, second)
	}
	used := time.Now()
	for _, k := range []NewAPIKey{first, second} {
		if got, err := s.Authenticate(ctx, k.Secret, "test"); err != nil || got != merchant {
			t.Fatalf("Authenticate(%s) = %v, %v", k.ID, got, err)
		}
	}
	// The last uses are written a moment after the requests (keyuse.go).
	for _, k := range []NewAPIKey{first, second} {
		waitLastUse(t, s, k.Secret, used)
	}

	keys, err := s.ListAPIKeys(ctx, merchant)
	if err != nil || len(keys) != 2 || keys[0].ID != first.ID || keys[1].ID != second.ID {
		t.Fatalf("ListAPIKeys = %+v, %v", keys, err)
	}
	for _, k := range keys {
		if k.LastUsedAt == nil || k.RevokedAt != nil || k.CreatedAt.IsZero() {
			t.Errorf("listed %+v, want used, not revoked", k)
		}
	}

	// Last use: not rewritten within the minute, rewritten after it.
	s.auth = authCache{}
	if _, err := s.Authenticate(ctx, first.Secret, "test"); err != nil {
		t.Fatal(err)
	}
	if keys2, _ := s.ListAPIKeys(ctx, merchant); !keys2[0].LastUsedAt.Equal(*keys[0].LastUsedAt) {
		t.Errorf("last use rewritten within the minute: %v, then %v", keys[0].LastUsedAt, keys2[0].LastUsedAt)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE api_keys SET last_used_at = now() - interval '61 seconds' WHERE id = $1`, first.ID); err != nil {
		t.Fatal(err)
	}
	s.auth = authCache{}
	used = time.Now()
	if _, err := s.Authenticate(ctx, first.Secret, "test"); err != nil {
		t.Fatal(err)
	}
	waitLastUse(t, s, first.Secret, used)

	revoked, err := s.RevokeAPIKey(ctx, first.ID)
	if err != nil || revoked.RevokedAt == nil {
		t.Fatalf("RevokeAPIKey = %+v, %v", revoked, err)
	}
	s.auth = authCache{}
	if _, err := s.Authenticate(ctx, first.Secret, "test"); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Errorf("the revoked key: %v, want ErrUnauthenticated", err)
	}
	if got, err := s.Authenticate(ctx, second.Secret, "test"); err != nil || got != merchant {
		t.Errorf("the other key after the revocation: %v, %v", got, err)
	}
	if keys, _ = s.ListAPIKeys(ctx, merchant); keys[0].RevokedAt == nil || keys[1].RevokedAt != nil {
		t.Errorf("after revoking the first: %+v", keys)
	}

	unknown := uuid.New()
	if _, err := s.RevokeAPIKey(ctx, first.ID); !errors.Is(err, ErrAPIKeyRevoked) {
		t.Errorf("revoking twice: %v, want ErrAPIKeyRevoked", err)
	}
	if _, err := s.RevokeAPIKey(ctx, "key_nope"); !errors.Is(err, ErrUnknownAPIKey) {
		t.Errorf("revoking an unknown key: %v, want ErrUnknownAPIKey", err)
	}
	if _, err := s.CreateAPIKey(ctx, unknown); !errors.Is(err, ErrUnknownMerchant) {
		t.Errorf("a key for an unknown merchant: %v, want ErrUnknownMerchant", err)
	}
	if _, err := s.ListAPIKeys(ctx, unknown); !errors.Is(err, ErrUnknownMerchant) {
		t.Errorf("listing an unknown merchant's keys: %v, want ErrUnknownMerchant", err)
	}
}

// TestRevocationReachesEveryReplica: a key in use on one store (a replica) is
// revoked through another; the first refuses it within revocationBound.
func TestRevocationReachesEveryReplica(t *testing.T) {
	const revocationBound = 2 * time.Second
	ctx := context.Background()
	url := pgtest.DatabaseURL(t)
	replica, admin := openStore(t, url), openStore(t, url)
	merchant, key, err := admin.RegisterMerchant(ctx, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := replica.Authenticate(ctx, key.Secret, "test"); err != nil || got != merchant {
		t.Fatalf("before the revocation: %v, %v", got, err)
	}
	if _, err := admin.RevokeAPIKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for {
		_, err := replica.Authenticate(ctx, key.Secret, "test")
		if errors.Is(err, payment.ErrUnauthenticated) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(revoked) > 2*revocationBound {
			t.Fatalf("the replica still accepts the key %s after the revocation", time.Since(revoked))
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(revoked)
	t.Logf("the replica refused the revoked key %s after the revocation committed", took.Round(time.Millisecond))
	if took > revocationBound {
		t.Errorf("revocation took %s to reach the replica, want at most %s", took, revocationBound)
	}
}

// TestListMerchants: every merchant, oldest first, with its keys that are not
// revoked counted; a merchant whose keys are all revoked, or who has none,
// counts 0. Its own database, so that no other test's merchant is listed.
func TestListMerchants(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	all := MerchantQuery{Limit: 100}
	if got, err := s.ListMerchants(ctx, all); err != nil || len(got.Items) != 0 || got.HasMore {
		t.Fatalf("ListMerchants on no merchants = %+v, %v; want none", got, err)
	}
	acme, acmeKey, err := s.RegisterMerchant(ctx, "Acme")
	if err != nil {
		t.Fatal(err)
	}
	globex, globexKey, err := s.RegisterMerchant(ctx, "Globex")
	if err != nil {
		t.Fatal(err)
	}
	initech, _, err := s.RegisterMerchant(ctx, "Initech")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `DELETE FROM api_keys WHERE merchant_id = $1`, initech); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.CreateAPIKey(ctx, acme); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{acmeKey.ID, globexKey.ID} {
		if _, err := s.RevokeAPIKey(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// Acme, registered first, is made the newest by the clock, so the order
	// under test is created_at's and not the registration's or the id's.
	if _, err := s.Pool().Exec(ctx, `UPDATE merchants SET created_at = now() + interval '1 hour' WHERE id = $1`, acme); err != nil {
		t.Fatal(err)
	}

	p, err := s.ListMerchants(ctx, all)
	if err != nil || p.HasMore {
		t.Fatal(p, err)
	}
	got := p.Items
	want := []struct {
		id     uuid.UUID
		name   string
		active int
	}{{globex, "Globex", 0}, {initech, "Initech", 0}, {acme, "Acme", 2}}
	if len(got) != len(want) {
		t.Fatalf("ListMerchants = %+v, want %d merchants", got, len(want))
	}
	for i, w := range want {
		m := got[i]
		if m.ID != w.id || m.Name != w.name || m.ActiveAPIKeys != w.active || time.Since(m.CreatedAt) > 2*time.Hour {
			t.Errorf("merchant %d: %+v, want %s %q with %d active keys", i, m, w.id, w.name, w.active)
		}
	}
}
