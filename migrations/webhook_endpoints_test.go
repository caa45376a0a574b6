package migrations_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestWebhookEndpointsRoundTrip migrates up to 0012 and back: an endpoint
// starts its cursor at the event horizon; the way back refuses while an
// endpoint is recorded, drops the table once none is, and 0012 applies
// again after it.
func TestWebhookEndpointsRoundTrip(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 13)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	exists := func() bool {
		t.Helper()
		var ok bool
		if err := conn.QueryRow(t.Context(), `SELECT to_regclass('webhook_endpoints') IS NOT NULL`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	exec(`INSERT INTO merchants (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'acme')`)
	exec(`INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, cursor_tx)
SELECT '00000000-0000-0000-0000-000000000001', gen_random_uuid(), 'https://example.com/hook', '{*}', 'whsec_x', horizon
FROM payments_event_horizon()`)

	err = migrations.Down(dbURL)
	if err == nil || !strings.Contains(err.Error(), "webhook_endpoints holds endpoints") {
		t.Fatalf("migrating back with an endpoint: %v, want a refusal", err)
	}
	// The refusal left the schema dirty at 12: recorded clean again by hand,
	// as an operator would after emptying the table.
	if err := migrations.Force(dbURL, 12); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("the refused migration dropped the table")
	}
	exec(`DELETE FROM webhook_endpoints`)
	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatal("webhook_endpoints still exists after migrating back")
	}
	if v, dirty, err := migrations.Version(dbURL); err != nil || v != 11 || dirty {
		t.Fatalf("after migrating back: version %d, dirty %t, %v; want 11, clean", v, dirty, err)
	}
	if err := migrations.Up(dbURL); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("webhook_endpoints missing after migrating up again")
	}
}
