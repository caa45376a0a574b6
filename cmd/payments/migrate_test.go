package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestMigrateForceRecoversADirtySchema walks the recovery from a failed
// migration on a real database: the newest migration, n, "failed" having
// changed nothing (it runs in a transaction), so the schema is dirty at n but
// matches the one before, p (n-1, unless numbers were skipped). migrate up
// refuses and says what to do; migrate force refuses versions no migration
// has, before any warning; migrate force p warns and records p, clean;
// migrate up then applies n. force -1 empties the version table.
func TestMigrateForceRecoversADirtySchema(t *testing.T) {
	n, p := newestMigrations(t)
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
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = true`, n); err != nil {
		t.Fatal(err)
	}

	_, _, err = migrate("up")
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the schema is dirty at version %d", n)) ||
		!strings.Contains(err.Error(), "then run: payments migrate force N") {
		t.Errorf("migrate up on a dirty schema = %v, want a refusal naming the version and migrate force", err)
	}
	t.Logf("migrate up on the dirty schema: %v", err)
	if _, v, dirty := schema(); v != n || !dirty {
		t.Fatalf("after the refusal: version %d, dirty %t; want %d, true", v, dirty, n)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"force"}, "name the version"},
		{[]string{"force", "seven"}, `invalid VERSION "seven"`},
		{[]string{"force", "-2"}, `invalid VERSION "-2"`},
		{[]string{"force", fmt.Sprint(n + 1)}, fmt.Sprintf("no such migration %d: want -1 (none applied) or a migration's version, 1 to %d", n+1, n)},
		{[]string{"force", "0"}, "no such migration 0"},
	} {
		out, errs, err := migrate(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || out != "" || errs != "" {
			t.Errorf("migrate %s: %v, stdout %q, stderr %q; want an error containing %q and no output", strings.Join(tc.args, " "), err, out, errs, tc.want)
		}
	}
	if _, v, dirty := schema(); v != n || !dirty {
		t.Fatalf("after refused forces: version %d, dirty %t; want %d, true", v, dirty, n)
	}

	out, errs, err := migrate("force", fmt.Sprint(p))
	if err != nil {
		t.Fatal(err)
	}
	if out != fmt.Sprintf("schema version %d (dirty: false)\n", p) {
		t.Errorf("migrate force %d printed %q", p, out)
	}
	if !strings.HasPrefix(errs, fmt.Sprintf("WARNING: migrate force records schema version %d as applied and clean (it was %d, dirty: true).\n", p, n)) ||
		!strings.Contains(errs, "It runs no migration and changes no table") {
		t.Errorf("migrate force %d warned %q", p, errs)
	}
	if rows, v, dirty := schema(); rows != 1 || v != p || dirty {
		t.Fatalf("after force %d: %d rows, version %d, dirty %t; want 1, %d, false", p, rows, v, dirty, p)
	}

	if out, _, err := migrate("up"); err != nil || out != fmt.Sprintf("schema version %d (dirty: false)\n", n) {
		t.Fatalf("migrate up after force %d = %v, printed %q", p, err, out)
	}

	if out, _, err := migrate("force", "-1", "--database-url", dbURL); err != nil || out != "schema version 0 (dirty: false)\n" {
		t.Errorf("migrate force -1 = %v, printed %q", err, out)
	}
	if rows, _, _ := schema(); rows != 0 {
		t.Errorf("after force -1: %d rows in schema_migrations, want 0", rows)
	}
}

// newestMigrations are the highest version among migrations/*.up.sql and
// the one before it.
func newestMigrations(t *testing.T) (newest, previous int64) {
	t.Helper()
	ups, err := filepath.Glob("../../migrations/*.up.sql")
	if err != nil || len(ups) < 2 {
		t.Fatalf("fewer than 2 migrations found (%v)", err)
	}
	var versions []int64
	for _, f := range ups {
		prefix, _, _ := strings.Cut(filepath.Base(f), "_")
		v, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil {
			t.Fatalf("migration %s: %v", f, err)
		}
		versions = append(versions, v)
	}
	slices.Sort(versions)
	return versions[len(versions)-1], versions[len(versions)-2]
}
