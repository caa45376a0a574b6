package migrations_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestWebhookDeliveriesRoundTrip migrates up to 0013 and back: an attempt
// holds a status or an error, never both nor neither; the way back refuses
// while a delivery is recorded, drops both tables once none is, and 0013
// applies again after it.
func TestWebhookDeliveriesRoundTrip(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 14)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	exec := func(sql string) error {
		_, err := conn.Exec(t.Context(), sql)
		return err
	}
	must := func(sql string) {
		t.Helper()
		if err := exec(sql); err != nil {
			t.Fatal(err)
		}
	}
	exists := func() bool {
		t.Helper()
		var ok bool
		if err := conn.QueryRow(t.Context(), `SELECT to_regclass('webhook_deliveries') IS NOT NULL AND to_regclass('webhook_attempts') IS NOT NULL`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	const m, e, ev = `'00000000-0000-0000-0000-000000000001'`, `'00000000-0000-0000-0000-0000000000e1'`, `'00000000-0000-0000-0000-0000000000a1'`
	must(`INSERT INTO merchants (id, name) VALUES (` + m + `, 'acme')`)
	must(`INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, cursor_tx)
SELECT ` + m + `, ` + e + `, 'https://example.com/hook', '{*}', 'whsec_x', horizon FROM payments_event_horizon()`)
	must(`INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id) VALUES (` + m + `, ` + e + `, ` + ev + `)`)
	attempt := `INSERT INTO webhook_attempts (merchant_id, endpoint_id, id, event_id, attempted_at, status, error, latency_ms)
VALUES (` + m + `, ` + e + `, gen_random_uuid(), ` + ev + `, now(), `
	for _, tc := range []struct {
		name, values string
		ok           bool
	}{
		{"a status", `500, NULL, 3)`, true},
		{"an error", `NULL, 'connection refused', 1)`, true},
		{"both", `500, 'connection refused', 1)`, false},
		{"neither", `NULL, NULL, 1)`, false},
	} {
		if err := exec(attempt + tc.values); (err == nil) != tc.ok {
			t.Errorf("an attempt with %s: %v, want ok=%t", tc.name, err, tc.ok)
		}
	}

	err = migrations.Down(dbURL)
	if err == nil || !strings.Contains(err.Error(), "webhook_deliveries or webhook_attempts holds rows") {
		t.Fatalf("migrating back with deliveries: %v, want a refusal", err)
	}
	if err := migrations.Force(dbURL, 13); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("the refused migration dropped a table")
	}
	must(`DELETE FROM webhook_attempts`)
	must(`DELETE FROM webhook_deliveries`)
	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(dbURL); err != nil || v != 12 || dirty || exists() {
		t.Fatalf("after migrating back: version %d, dirty %t, %v, tables exist %t; want 12, clean, none", v, dirty, err, exists())
	}
	if err := migrations.Up(dbURL); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("the tables are missing after migrating up again")
	}
}
