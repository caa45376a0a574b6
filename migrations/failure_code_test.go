package migrations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestFailureCodeIsKebabCase migrates failed charges to the failure code
// spelt as its problem (0010), insufficient-funds, and back; a succeeded
// charge keeps no code, and an event written before keeps its payload, the
// former spelling included: events are immutable once written.
func TestFailureCodeIsKebabCase(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 10)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(t.Context(), sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	merchant, acct, failed, succeeded := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	exec(`INSERT INTO merchants (id, name) VALUES ($1, 'm')`, merchant)
	exec(`INSERT INTO accounts (merchant_id, id, currency) VALUES ($1, $2, 'USD')`, merchant, acct)
	exec(`INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, failure_code)
VALUES ($1, $2, $4, 500, 'USD', 'failed', 'insufficient_funds'), ($1, $3, $4, 5, 'USD', 'succeeded', NULL)`,
		merchant, failed, succeeded, acct)
	const payload = `{"object": "charge", "status": "failed", "failure_code": "insufficient_funds"}`
	exec(`INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES ($1, gen_random_uuid(), 'charge', $2, 'charge.failed', $3)`, merchant, failed, payload)

	check := func(when, wantCode string) {
		t.Helper()
		var code, none *string
		var event string
		if err := conn.QueryRow(t.Context(), `
SELECT (SELECT failure_code FROM charges WHERE id = $1), (SELECT failure_code FROM charges WHERE id = $2),
       (SELECT payload::text FROM events WHERE aggregate_id = $1)`, failed, succeeded).Scan(&code, &none, &event); err != nil {
			t.Fatal(err)
		}
		if code == nil || *code != wantCode || none != nil {
			t.Errorf("%s: the failed charge's code is %v, the succeeded one's %v; want %s and none", when, deref(code), deref(none), wantCode)
		}
		if event != payload {
			t.Errorf("%s: the event's payload is %s, want it unchanged: %s", when, event, payload)
		}
	}
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 11)); err != nil {
		t.Fatal(err)
	}
	check("after 0010", "insufficient-funds")
	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	check("after migrating back", "insufficient_funds")
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return *s
}
