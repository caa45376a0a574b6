package postgres

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPositionalQuery: named arguments become $n in the order they first
// appear, a name used twice keeps its number, a cast after a name stays, and
// the arguments come in that order.
func TestPositionalQuery(t *testing.T) {
	sql, args := positionalQuery(`SELECT @b::uuid[], @a, @b, @a_c::text`, pgx.NamedArgs{"a": 1, "b": 2, "a_c": 3, "unused": 4})
	if want := `SELECT $1::uuid[], $2, $1, $3::text`; sql != want {
		t.Errorf("sql %q, want %q", sql, want)
	}
	if want := []any{2, 1, 3}; !slices.Equal(args, want) {
		t.Errorf("args %v, want %v", args, want)
	}
}
