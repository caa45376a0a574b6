package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestWebhookFanOutPositionRoundTrip migrates to 0022 from the migration
// before it: every endpoint starts behind, and the position starts past every
// event committed before and at or below the event horizon; enabling an endpoint flags it
// behind, and nothing else does. The way back drops the position, the flag
// and the trigger, and 0022 applies again after it.
func TestWebhookFanOutPositionRoundTrip(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 22)); err != nil {
		t.Fatal(err)
	}
	before, _, err := migrations.Version(dbURL)
	if err != nil {
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
	query := func(sql string) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(t.Context(), sql).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	flags := func() string {
		return query(`SELECT string_agg(right(id::text, 2) || '=' || behind, ' ' ORDER BY id) FROM webhook_endpoints`)
	}

	const m = `'00000000-0000-0000-0000-000000000001'`
	exec(`INSERT INTO merchants (id, name) VALUES (` + m + `, 'acme')`)
	exec(`INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES (` + m + `, '00000000-0000-0000-0000-0000000000a1', 'account', gen_random_uuid(), 'account.created', '{}')`)
	// e1 is live and enabled, e2 disabled, e3 deleted.
	exec(`INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, cursor_tx, status, deleted_at)
SELECT ` + m + `, ('00000000-0000-0000-0000-0000000000e' || n)::uuid, 'https://example.com/hook', '{*}', 'whsec_x', horizon,
       CASE WHEN n = 2 THEN 'disabled' ELSE 'enabled' END, CASE WHEN n = 3 THEN now() END
FROM payments_event_horizon(), generate_series(1, 3) n`)

	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 23)); err != nil {
		t.Fatal(err)
	}
	if got, want := flags(), "e1=true e2=true e3=true"; got != want {
		t.Errorf("after 0022: %s, want %s", got, want)
	}
	if got := query(`SELECT ((SELECT (tx_id, seq) FROM webhook_fanout_position) > (e.tx_id, e.seq)
    AND (SELECT (tx_id, seq) FROM webhook_fanout_position) <= (h.horizon, 0))::text
FROM events e, payments_event_horizon() h`); got != "true" {
		t.Errorf("the position is not past the event committed before 0022 and at or below the horizon")
	}

	exec(`UPDATE webhook_endpoints SET behind = false`)
	exec(`UPDATE webhook_endpoints SET status = 'disabled' WHERE id = '00000000-0000-0000-0000-0000000000e1'`)
	exec(`UPDATE webhook_endpoints SET url = 'https://example.com/other' WHERE id = '00000000-0000-0000-0000-0000000000e2'`)
	exec(`UPDATE webhook_endpoints SET status = 'enabled' WHERE id = '00000000-0000-0000-0000-0000000000e3'`)
	if got, want := flags(), "e1=false e2=false e3=false"; got != want {
		t.Errorf("after disabling, changing a URL and enabling an enabled endpoint: %s, want %s", got, want)
	}
	exec(`UPDATE webhook_endpoints SET status = 'enabled', url = 'https://example.com/back' WHERE id = '00000000-0000-0000-0000-0000000000e1'`)
	if got, want := flags(), "e1=true e2=false e3=false"; got != want {
		t.Errorf("after enabling e1 again: %s, want %s", got, want)
	}

	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(dbURL); err != nil || v != before || dirty {
		t.Fatalf("after migrating back: version %d, dirty %t, %v; want %d, clean", v, dirty, err, before)
	}
	if got := query(`SELECT (to_regclass('webhook_fanout_position') IS NULL
    AND to_regprocedure('webhook_endpoint_enabled()') IS NULL
    AND NOT EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'webhook_endpoints' AND column_name = 'behind'))::text`); got != "true" {
		t.Error("migrating back left the position, the trigger's function or the flag")
	}
	exec(`UPDATE webhook_endpoints SET status = 'disabled' WHERE id = '00000000-0000-0000-0000-0000000000e1'`)
	exec(`UPDATE webhook_endpoints SET status = 'enabled' WHERE id = '00000000-0000-0000-0000-0000000000e1'`)
	if err := migrations.Up(dbURL); err != nil {
		t.Fatal(err)
	}
	if got, want := flags(), "e1=true e2=true e3=true"; got != want {
		t.Errorf("after 0022 again: %s, want %s", got, want)
	}
}
