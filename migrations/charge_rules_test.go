package migrations_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/migrations"
)

// chargeRulesProbe tries a charge row for every combination of the values
// charges' rules look at, each as its own INSERT, and returns what became of
// each: "ok", or the name of the constraint it was refused under. The
// combinations cover every rule on both sides (tested below).
const chargeRulesProbe = `
DO $$
DECLARE
    c record;
    broken text;
BEGIN
    CREATE TEMP TABLE probe (n int PRIMARY KEY, outcome text NOT NULL);
    FOR c IN
        SELECT row_number() OVER () AS n, *
        FROM unnest(ARRAY['succeeded', 'failed', 'authorized', 'voided', 'expired', 'processing',
                          'reversing', 'reversed', 'requires_review', 'lost']) status,
             unnest(ARRAY[0, 1, 5]::bigint[]) amount,
             unnest(ARRAY[-1, 0, 1, 5, 6]::bigint[]) captured,
             unnest(ARRAY[-1, 0, 1, 5, 6]::bigint[]) refunded,
             unnest(ARRAY[NULL, 'insufficient-funds']) failure_code,
             unnest(ARRAY[NULL, '00000000-0000-0000-0000-0000000000a1']::uuid[]) account_id,
             unnest(ARRAY[NULL, 'pm_card_visa', 'card_visa']) payment_method,
             unnest(ARRAY[NULL, now() + interval '1 day']) expires_at
    LOOP
        BEGIN
            INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, failure_code,
                                 amount_captured, amount_refunded, payment_method, expires_at)
            VALUES ('00000000-0000-0000-0000-000000000001', gen_random_uuid(), c.account_id, c.amount, 'USD',
                    c.status, c.failure_code, c.captured, c.refunded, c.payment_method, c.expires_at);
            INSERT INTO probe VALUES (c.n, 'ok');
        EXCEPTION WHEN check_violation THEN
            GET STACKED DIAGNOSTICS broken = CONSTRAINT_NAME;
            INSERT INTO probe VALUES (c.n, broken);
        END;
    END LOOP;
END $$`

// probeChargeRules runs chargeRulesProbe on a fresh database at the schema
// fsys migrates to (then, with down, one migration back), and returns its
// outcomes in order and how many of each there were.
func probeChargeRules(t *testing.T, conn *pgx.Conn) (outcomes string, counts map[string]int) {
	t.Helper()
	for _, sql := range []string{
		`INSERT INTO merchants (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'acme')`,
		`INSERT INTO accounts (merchant_id, id, currency, balance)
VALUES ('00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-0000000000a1', 'USD', 0)`,
		chargeRulesProbe,
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.QueryRow(t.Context(), `SELECT string_agg(outcome, ' ' ORDER BY n) FROM probe`).Scan(&outcomes); err != nil {
		t.Fatal(err)
	}
	counts = map[string]int{}
	for o := range strings.FieldsSeq(outcomes) {
		counts[o]++
	}
	for _, sql := range []string{`DROP TABLE probe`, `DELETE FROM charges`, `DELETE FROM accounts`, `DELETE FROM merchants`} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	return outcomes, counts
}

// TestChargeRulesInOneFunction checks 0030 against the eleven constraints it
// replaces: 18,000 charge rows, every combination of the values the rules
// read, refused or taken alike, each refusal under the same constraint name
// (the first broken by name, as PostgreSQL checks them), every rule seen
// refusing some row. An update is checked too (a refund past the captured
// amount). Migrated back, the eleven constraints give the same outcomes
// again.
func TestChargeRulesInOneFunction(t *testing.T) {
	connect := func(dbURL string) *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(t.Context()) })
		return conn
	}
	before := emptyDatabase(t)
	if err := migrations.UpFrom(before, migrationsBefore(t, 30)); err != nil {
		t.Fatal(err)
	}
	after := emptyDatabase(t)
	if err := migrations.UpFrom(after, migrationsBefore(t, 31)); err != nil {
		t.Fatal(err)
	}
	var constraints int
	if err := connect(after).QueryRow(t.Context(),
		`SELECT count(*) FROM pg_constraint WHERE conrelid = 'charges'::regclass AND contype = 'c'`).Scan(&constraints); err != nil {
		t.Fatal(err)
	}
	if constraints != 1 {
		t.Fatalf("charges has %d CHECK constraints after 0030, want 1", constraints)
	}

	want, wantCounts := probeChargeRules(t, connect(before))
	rules := []string{
		"charges_amount_check", "charges_captured_check", "charges_card_status_check", "charges_check",
		"charges_check1", "charges_check2", "charges_expiry_check", "charges_payer_check",
		"charges_payment_method_check", "charges_refunded_check", "charges_status_check",
	}
	for _, r := range append(rules, "ok") {
		if wantCounts[r] == 0 {
			t.Errorf("no row came out %s before 0030: the probe does not reach that rule", r)
		}
	}
	t.Logf("outcomes before 0030: %v", wantCounts)

	got, gotCounts := probeChargeRules(t, connect(after))
	if got != want {
		t.Errorf("outcomes after 0030 differ: %v, before %v", gotCounts, wantCounts)
	}

	// An update is checked as an insert is: a refund past what was captured.
	for _, dbURL := range []string{before, after} {
		conn := connect(dbURL)
		for _, sql := range []string{
			`INSERT INTO merchants (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'acme')`,
			`INSERT INTO charges (merchant_id, id, amount, currency, status, amount_captured, payment_method)
VALUES ('00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-0000000000c1', 5, 'USD', 'succeeded', 3, 'pm_card_visa')`,
		} {
			if _, err := conn.Exec(t.Context(), sql); err != nil {
				t.Fatal(err)
			}
		}
		_, err := conn.Exec(t.Context(), `UPDATE charges SET amount_refunded = 4`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "charges_refunded_check" {
			t.Errorf("refunding 4 of 3 captured: %v, want a violation of charges_refunded_check", err)
		}
		for _, sql := range []string{`DELETE FROM charges`, `DELETE FROM merchants`} {
			if _, err := conn.Exec(t.Context(), sql); err != nil {
				t.Fatal(err)
			}
		}
	}

	if err := migrations.Down(after); err != nil {
		t.Fatal(err)
	}
	if version, _, err := migrations.Version(after); err != nil || version != 29 {
		t.Fatalf("version after one migration down: %d (%v), want 29", version, err)
	}
	back, backCounts := probeChargeRules(t, connect(after))
	if back != want {
		t.Errorf("outcomes migrated back differ: %v, before %v", backCounts, wantCounts)
	}
	if err := migrations.UpFrom(after, migrationsBefore(t, 31)); err != nil {
		t.Fatalf("0030 again after its way back: %v", err)
	}
}
