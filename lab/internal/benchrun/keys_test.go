package benchrun

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/lab/internal/labtest"
)

func TestMain(m *testing.M) { labtest.Main(m) }

// migrated is a new database migrated by this checkout's service, as make
// bench migrates its scratch databases (NewMerchant), and the id of the
// merchant created there for the keys to belong to.
func migrated(t *testing.T) (url, merchant string) {
	t.Helper()
	url = labtest.NewDatabase(t)
	m, err := NewMerchant(t.Context(), labtest.Payments(t), url)
	if err != nil {
		t.Fatal(err)
	}
	return url, m.ID
}

// SeedKeys stores completed charges as the service would: the keys of the
// series, distinct per tag, each with a 32-byte fingerprint, status 201
// and a JSON body naming its charge, created when the expression says.
func TestSeedKeys(t *testing.T) {
	ctx := context.Background()
	url, m := migrated(t)
	if err := SeedKeys(ctx, url, m, "expired", 1, 500, "now() - interval '25 hours' - i * interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if err := SeedKeys(ctx, url, m, "live", 1, 300, "now() - i * interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if err := AfterSeeding(ctx, url); err != nil {
		t.Fatal(err)
	}
	count := func(where string) string {
		v, err := Value(ctx, url, "SELECT count(*)::text FROM idempotency_keys WHERE merchant_id = $1 AND "+where, m)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := count("created_at < now() - interval '24 hours'"); got != "500" {
		t.Errorf("expired keys = %s, want 500", got)
	}
	if got := count("created_at >= now() - interval '24 hours'"); got != "300" {
		t.Errorf("live keys = %s, want 300", got)
	}
	if got := count("status = 201 AND length(fingerprint) = 32 AND location LIKE '/v1/charges/ch_%'"); got != "800" {
		t.Errorf("keys stored as completed charges = %s, want 800", got)
	}
	// The first expired key is md5('seed-expired-1') as a UUID, and its body
	// is a charge whose id its Location names.
	var body []byte
	var location string
	err := withConn(ctx, url, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT body, location FROM idempotency_keys WHERE key = md5('seed-expired-1')::uuid::text").Scan(&body, &location)
	})
	if err != nil {
		t.Fatal(err)
	}
	var charge struct{ ID, Status string }
	if err := json.Unmarshal(body, &charge); err != nil || charge.Status != "succeeded" || location != "/v1/charges/"+charge.ID {
		t.Errorf("body %s (err %v), location %q: want a succeeded charge its Location names", body, err, location)
	}
}

// A held key is in flight for every other session: its row is there but
// not committed, and its advisory lock is taken, until Release.
func TestHoldKey(t *testing.T) {
	ctx := context.Background()
	url, m := migrated(t)
	held, err := HoldKey(ctx, url, m, "held-1")
	if err != nil {
		t.Fatal(err)
	}
	lock := "SELECT pg_try_advisory_lock(hashtextextended($1::uuid::text || $2, 0))::text"
	if got, err := Value(ctx, url, lock, m, "held-1"); err != nil || got != "false" {
		t.Errorf("another session took the held key's lock: %s (err %v)", got, err)
	}
	// Another session's insert of the same key waits on the held row (its
	// lock_timeout says so) instead of going through.
	err = withConn(ctx, url, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "SET lock_timeout = '200ms'"); err != nil {
			return err
		}
		_, err := c.Exec(ctx, "INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ($1, $2, '\\x00')", m, "held-1")
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Errorf("another session's insert of the held key: %v, want a lock timeout", err)
	}
	held.Release(ctx)
	if got, err := Value(ctx, url, lock, m, "held-1"); err != nil || got != "true" {
		t.Errorf("after Release the lock is still held: %s (err %v)", got, err)
	}
	if got, _ := Value(ctx, url, "SELECT count(*)::text FROM idempotency_keys"); got != "0" {
		t.Errorf("after Release %s key rows remain, want 0 (rolled back)", got)
	}
}
