package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestExpectOwnsOnlyTheDatabasesClock: a batch decided ahead carries the
// service's clock into its rows, so the check (migration 0029) refuses a
// clock later than its own moment (whatever follows the charge would read an
// earlier clock than the charge's) or more than a second before its
// transaction began, and takes one in between.
func TestExpectOwnsOnlyTheDatabasesClock(t *testing.T) {
	ctx := context.Background()
	conn := testkit.Connect(t, pgtest.DatabaseURL(t))
	for _, c := range []struct {
		clock   string
		refused bool
	}{
		{"clock_timestamp() + interval '50 milliseconds'", true},
		{"now() - interval '2 seconds'", true},
		{"now() - interval '500 milliseconds'", false},
		{"now()", false},
	} {
		_, err := conn.Exec(ctx, `SELECT payments_charge_batch_expect('{}', '{}', '{}', '{}', '{}', '{}', `+c.clock+`)`)
		var pgErr *pgconn.PgError
		switch refused := errors.As(err, &pgErr) && pgErr.Code == "PA001"; {
		case refused != c.refused:
			t.Errorf("batch clock %s: error %v, want refused %t", c.clock, err, c.refused)
		case err != nil && !refused:
			t.Errorf("batch clock %s: %v", c.clock, err)
		}
	}
}
