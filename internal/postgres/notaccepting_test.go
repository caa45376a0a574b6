package postgres

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestADatabaseRefusingConnectionsIsUnavailable: a database that is not
// accepting connections (SQLSTATE 55000 when connecting: ALTER DATABASE ...
// ALLOW_CONNECTIONS false, as during some maintenance) is unavailable, a 503
// to retry, for an API key's lookup as for every other statement: not a 500.
func TestADatabaseRefusingConnectionsIsUnavailable(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	s := openStore(t, dbURL)
	_, key, err := s.RegisterMerchant(ctx, "refused")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	admin, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `ALTER DATABASE "`+name+`" ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `ALTER DATABASE "`+name+`" ALLOW_CONNECTIONS true`) })
	// The pool's connections go; a new one is refused.
	s.Pool().Reset()
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name); err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, key.Secret, "client")
	if !errors.Is(err, payment.ErrUnavailable) {
		t.Errorf("an API key's lookup: %v, want payment.ErrUnavailable (503)", err)
	}
	if !strings.Contains(err.Error(), "55000") && !strings.Contains(err.Error(), "not currently accepting connections") {
		t.Errorf("an API key's lookup: %v, want the cause named", err)
	}
}
