package migrations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestQuotedKeysAreUnquoted migrates keys stored before an Idempotency-Key
// could be sent as a Structured Field string (0009): a stored key that is a
// well-formed string holding a valid key becomes that key, so a retry sent
// after the upgrade finds it; any other key, and a quoted one whose merchant
// already holds the unquoted key, stays as it was. Migrating back changes
// nothing.
func TestQuotedKeysAreUnquoted(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 9)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	a, b := uuid.New(), uuid.New()
	stored := []struct {
		merchant  uuid.UUID
		key, want string
	}{
		{a, `"abc"`, `abc`},
		{a, `"k\"1\\2"`, `k"1\2`},
		{a, `"\"q"`, `"q`},
		{a, `plain`, `plain`},
		{a, `k"1\2x`, `k"1\2x`}, // bare, with a quote inside
		{a, `"abc`, `"abc`},     // no closing quote
		{a, `""`, `""`},         // the empty string: no key
		{a, `"a\b"`, `"a\b"`},   // an escape of another character
		{a, `"abc"d`, `"abc"d`}, // more after the string
		{b, `"dup"`, `"dup"`},   // b holds dup too: both stay
		{b, `dup`, `dup`},
		{b, `"abc"`, `abc`}, // another merchant's abc
	}
	for _, s := range stored {
		if _, err := conn.Exec(t.Context(),
			`INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, body) VALUES ($1, $2, $3, 201, '{}')`,
			s.merchant, s.key, []byte(s.key)); err != nil {
			t.Fatal(err)
		}
	}

	check := func(when string, want func(i int) string) {
		t.Helper()
		for i, s := range stored {
			var n int
			if err := conn.QueryRow(t.Context(),
				`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2 AND fingerprint = $3`,
				s.merchant, want(i), []byte(s.key)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Errorf("%s: the key stored as %s is not %s", when, s.key, want(i))
			}
		}
	}
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 10)); err != nil {
		t.Fatal(err)
	}
	check("after 0009", func(i int) string { return stored[i].want })
	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	check("after migrating back", func(i int) string { return stored[i].want })
}
