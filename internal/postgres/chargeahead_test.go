package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestAheadOwnsOnlyTheDatabasesClock: a batch decided ahead carries the
// service's clock into its rows, so the statement that writes it refuses a
// clock later than its own moment (whatever follows the charge would read an
// earlier clock than the charge's) or more than a second before its
// transaction began, and takes one in between. The batch here is empty:
// only its clock is checked.
func TestAheadOwnsOnlyTheDatabasesClock(t *testing.T) {
	ctx := context.Background()
	conn := testkit.Connect(t, pgtest.DatabaseURL(t))
	for _, c := range []struct {
		name    string
		clock   func(start time.Time) time.Time
		refused bool
	}{
		{"a minute after the transaction began", func(start time.Time) time.Time { return start.Add(time.Minute) }, true},
		{"two seconds before it", func(start time.Time) time.Time { return start.Add(-2 * time.Second) }, true},
		{"half a second before it", func(start time.Time) time.Time { return start.Add(-500 * time.Millisecond) }, false},
		{"as it began", func(start time.Time) time.Time { return start }, false},
	} {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var start time.Time
			if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
				return err
			}
			args, err := postgres.EmptyAheadArgs(c.clock(start))
			if err != nil {
				return err
			}
			var storedAt time.Time
			return tx.QueryRow(ctx, postgres.WriteAheadSQL, args).Scan(&storedAt)
		})
		var pgErr *pgconn.PgError
		switch refused := errors.As(err, &pgErr) && pgErr.Code == "PA001"; {
		case refused != c.refused:
			t.Errorf("batch clock %s: error %v, want refused %t", c.name, err, c.refused)
		case err != nil && !refused:
			t.Errorf("batch clock %s: %v", c.name, err)
		}
	}
}
