package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestChargeResolutionsKeepTheAudit: 0025's table refuses a blank reason or
// operator and a status that contradicts the verdict, and migrating back
// refuses while it holds a resolution (the audit of who settled a charge and
// why is never dropped silently); once it holds none, the table goes.
func TestChargeResolutionsKeepTheAudit(t *testing.T) {
	dbURL := emptyDatabase(t)
	if err := migrations.UpFrom(dbURL, migrationsBefore(t, 26)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	merchant, charge := uuid.New(), uuid.New()
	if _, err := conn.Exec(t.Context(), `
WITH m AS (INSERT INTO merchants (id, name) VALUES ($1, 'm'))
INSERT INTO charges (merchant_id, id, payment_method, amount, currency, status, failure_code)
VALUES ($1, $2, 'pm_card_approve', 1000, 'EUR', 'failed', 'operator-resolved')`, merchant, charge); err != nil {
		t.Fatal(err)
	}
	insert := func(as, status, reason, operator string) error {
		_, err := conn.Exec(t.Context(), `
INSERT INTO charge_resolutions (merchant_id, id, charge_id, from_state, resolved_as, status, reason, operator, resolved_at)
VALUES ($1, gen_random_uuid(), $2, 'requires_review', $3, $4, $5, $6, now())`, merchant, charge, as, status, reason, operator)
		return err
	}
	for _, bad := range [][4]string{
		{"failed", "failed", "  ", "alice"},
		{"failed", "failed", strings.Repeat("r", 501), "alice"},
		{"failed", "failed", "no approval", ""},
		{"failed", "succeeded", "no approval", "alice"},
		{"succeeded", "failed", "kept", "alice"},
		{"authorized", "authorized", "kept", "alice"},
	} {
		if err := insert(bad[0], bad[1], bad[2], bad[3]); err == nil {
			t.Errorf("a resolution %q was written, want it refused", bad)
		}
	}
	if err := insert("failed", "failed", "no approval under the reference", "alice"); err != nil {
		t.Fatal(err)
	}
	err = migrations.Down(dbURL)
	if err == nil || !strings.Contains(err.Error(), "charge_resolutions holds the audit") {
		t.Fatalf("migrating back with a resolution: %v, want it refused", err)
	}
	// The refusal rolled back; the schema is marked dirty at 25, as after
	// any failed migration, until an operator says where it stands.
	if err := migrations.Force(dbURL, 25); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `DELETE FROM charge_resolutions`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Down(dbURL); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := conn.QueryRow(t.Context(), `SELECT to_regclass('charge_resolutions') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Errorf("charge_resolutions exists after migrating back: %t (%v)", exists, err)
	}
}
