package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestMigrateForceRecoversADirtySchema walks the recovery from a failed
// migration on a real database: migration 8 "failed" having changed nothing
// (it runs in a transaction), so the schema is dirty at 8 but matches 7.
// migrate up refuses and says what to do; migrate force refuses versions no
// migration has, before any warning; migrate force 7 warns and records 7,
// clean; migrate up then applies 8. force -1 empties the version table.
func TestMigrateForceRecoversADirtySchema(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	env := envOf(map[string]string{"DATABASE_URL": dbURL, "MIGRATE_WAIT": "5s"})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	schema := func() (rows int, version int64, dirty bool) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(max(version), -1), coalesce(bool_or(dirty), false) FROM schema_migrations`).
			Scan(&rows, &version, &dirty); err != nil {
			t.Fatal(err)
		}
		return rows, version, dirty
	}
	migrate := func(args ...string) (stdout, stderr string, err error) {
		t.Helper()
		var out, errs bytes.Buffer
		err = run(ctx, append([]string{"migrate"}, args...), env, &out, &errs)
		return out.String(), errs.String(), err
	}

	if _, _, err := migrate("down"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = 8, dirty = true`); err != nil {
		t.Fatal(err)
	}

	_, _, err = migrate("up")
	if err == nil || !strings.Contains(err.Error(), "the schema is dirty at version 8") ||
		!strings.Contains(err.Error(), "then run: payments migrate force N") {
		t.Errorf("migrate up on a dirty schema = %v, want a refusal naming the version and migrate force", err)
	}
	t.Logf("migrate up on the dirty schema: %v", err)
	if _, v, dirty := schema(); v != 8 || !dirty {
		t.Fatalf("after the refusal: version %d, dirty %t; want 8, true", v, dirty)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"force"}, "name the version"},
		{[]string{"force", "seven"}, `invalid VERSION "seven"`},
		{[]string{"force", "-2"}, `invalid VERSION "-2"`},
		{[]string{"force", "9"}, "no such migration 9: want -1 (none applied) or a migration's version, 1 to 8"},
		{[]string{"force", "0"}, "no such migration 0"},
	} {
		out, errs, err := migrate(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || out != "" || errs != "" {
			t.Errorf("migrate %s: %v, stdout %q, stderr %q; want an error containing %q and no output", strings.Join(tc.args, " "), err, out, errs, tc.want)
		}
	}
	if _, v, dirty := schema(); v != 8 || !dirty {
		t.Fatalf("after refused forces: version %d, dirty %t; want 8, true", v, dirty)
	}

	out, errs, err := migrate("force", "7")
	if err != nil {
		t.Fatal(err)
	}
	if out != "schema version 7 (dirty: false)\n" {
		t.Errorf("migrate force 7 printed %q", out)
	}
	if !strings.HasPrefix(errs, "WARNING: migrate force records schema version 7 as applied and clean (it was 8, dirty: true).\n") ||
		!strings.Contains(errs, "It runs no migration and changes no table") {
		t.Errorf("migrate force 7 warned %q", errs)
	}
	if rows, v, dirty := schema(); rows != 1 || v != 7 || dirty {
		t.Fatalf("after force 7: %d rows, version %d, dirty %t; want 1, 7, false", rows, v, dirty)
	}

	if out, _, err := migrate("up"); err != nil || out != "schema version 8 (dirty: false)\n" {
		t.Fatalf("migrate up after force 7 = %v, printed %q", err, out)
	}
	var cursor bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('outbox_cursor') IS NOT NULL`).Scan(&cursor); err != nil || !cursor {
		t.Errorf("migration 8's outbox_cursor exists: %t (%v)", cursor, err)
	}

	if out, _, err := migrate("force", "-1", "--database-url", dbURL); err != nil || out != "schema version 0 (dirty: false)\n" {
		t.Errorf("migrate force -1 = %v, printed %q", err, out)
	}
	if rows, _, _ := schema(); rows != 0 {
		t.Errorf("after force -1: %d rows in schema_migrations, want 0", rows)
	}
}
