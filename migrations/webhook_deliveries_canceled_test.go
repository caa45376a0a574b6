package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestWebhookDeliveriesCanceledRoundTrip migrates from 0015 to 0016: a
// deleted endpoint's pending deliveries, which 0015 left pending, are
// canceled, and no other; 'canceled' is a state. The way back turns
// canceled deliveries into abandoned ones (ended, never sent), which the
// former CHECK admits, and 0016 applies again after it.
func TestWebhookDeliveriesCanceledRoundTrip(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 16)); err != nil {
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
	states := func() string {
		t.Helper()
		var s string
		if err := conn.QueryRow(t.Context(), `SELECT string_agg(right(endpoint_id::text, 2) || right(event_id::text, 1) || '=' || state
    || CASE WHEN lease_until IS NULL THEN '' ELSE '+lease' END, ' ' ORDER BY endpoint_id, event_id) FROM webhook_deliveries`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	const m = `'00000000-0000-0000-0000-000000000001'`
	must(`INSERT INTO merchants (id, name) VALUES (` + m + `, 'acme')`)
	// e1 is live, e2 deleted; each has deliveries of events 1 to 3.
	must(`INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, cursor_tx, deleted_at)
SELECT ` + m + `, ('00000000-0000-0000-0000-0000000000e' || n)::uuid, 'https://example.com/hook', '{*}', 'whsec_x', horizon,
       CASE WHEN n = 2 THEN now() END
FROM payments_event_horizon(), generate_series(1, 2) n`)
	must(`INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, state, lease_until, claim)
SELECT ` + m + `, ('00000000-0000-0000-0000-0000000000e' || e)::uuid, ('00000000-0000-0000-0000-00000000000' || v)::uuid,
       CASE WHEN v = 1 THEN 'delivered' ELSE 'pending' END,
       CASE v WHEN 3 THEN now() + interval '1 minute' END, CASE v WHEN 3 THEN gen_random_uuid() END
FROM generate_series(1, 2) e, generate_series(1, 3) v`)
	if err := exec(`UPDATE webhook_deliveries SET state = 'canceled' WHERE event_id = '00000000-0000-0000-0000-000000000002'`); err == nil {
		t.Fatal("0015 admits the state canceled")
	}

	// Up to 0016, and no further: Down below is to revert 0016 itself.
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 17)); err != nil {
		t.Fatal(err)
	}
	if got, want := states(), "e11=delivered e12=pending e13=pending+lease e21=delivered e22=canceled e23=canceled"; got != want {
		t.Errorf("after 0016: %s, want %s", got, want)
	}
	must(`UPDATE webhook_deliveries SET state = 'canceled' WHERE endpoint_id = '00000000-0000-0000-0000-0000000000e1' AND event_id = '00000000-0000-0000-0000-000000000002'`)
	if err := exec(`UPDATE webhook_deliveries SET state = 'paused'`); err == nil {
		t.Error("0016 admits the state paused")
	}

	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(dbURL); err != nil || v != 15 || dirty {
		t.Fatalf("after migrating back: version %d, dirty %t, %v; want 15, clean", v, dirty, err)
	}
	if got, want := states(), "e11=delivered e12=abandoned e13=pending+lease e21=delivered e22=abandoned e23=abandoned"; got != want {
		t.Errorf("after migrating back: %s, want %s", got, want)
	}
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 17)); err != nil {
		t.Fatal(err)
	}
}
