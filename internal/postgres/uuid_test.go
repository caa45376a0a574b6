package postgres_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestIdentifiersAreSentAsTheyWere: an identifier reaches PostgreSQL as the
// same value whether a parameter is a uuid, a uuid array or text, and comes
// back equal; the zero identifier is a value, not NULL.
func TestIdentifiersAreSentAsTheyWere(t *testing.T) {
	t.Parallel()
	s := open(t, pgtest.DatabaseURL(t))
	ctx := t.Context()
	a, b := uuid.MustParse("01a24af9-e7d6-7a8b-93d8-40e6aa4ec688"), uuid.Nil
	var (
		asText, asTextParam string
		isNull              bool
		back                uuid.UUID
		arr                 []uuid.UUID
	)
	err := s.Pool().QueryRow(ctx, `SELECT $1::uuid::text, $2::text, $3::uuid IS NULL, $1::uuid, $4::uuid[]`,
		a, a, b, []uuid.UUID{a, b}).Scan(&asText, &asTextParam, &isNull, &back, &arr)
	if err != nil {
		t.Fatal(err)
	}
	if asText != a.String() || asTextParam != a.String() || isNull || back != a || len(arr) != 2 || arr[0] != a || arr[1] != b {
		t.Errorf("got %q, %q, null %v, %v, %v; want %v as uuid and as text, the zero id not null, and the array back",
			asText, asTextParam, isNull, back, arr, a)
	}
}
