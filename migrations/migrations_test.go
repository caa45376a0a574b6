package migrations_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestFailedMigrationNamesItself runs a broken migration against a real, empty
// database: the error names the migration and gives PostgreSQL's cause and line
// first, not the whole SQL file.
func TestFailedMigrationNamesItself(t *testing.T) {
	dbURL := emptyDatabase(t)
	broken := "-- a comment\nCREATE TABLE fine (id int);\n\nCREATE TABLEX broken (id int);\n" +
		strings.Repeat("-- padding that must not be printed\n", 50)
	fsys := fstest.MapFS{
		"0001_first.up.sql":    {Data: []byte("CREATE TABLE first (id int);\n")},
		"0001_first.down.sql":  {Data: []byte("DROP TABLE first;\n")},
		"0002_broken.up.sql":   {Data: []byte(broken)},
		"0002_broken.down.sql": {Data: []byte("DROP TABLE fine;\n")},
	}

	err := migrations.UpFrom(dbURL, fsys)
	if err == nil {
		t.Fatal("a broken migration succeeded")
	}
	msg := err.Error()
	t.Log(msg)
	want := `migration 2 (0002_broken.up.sql) failed: ERROR: syntax error at or near "TABLEX" (SQLSTATE 42601) at line 4: CREATE TABLEX broken (id int);`
	if !strings.Contains(msg, want) {
		t.Errorf("error\n\t%s\nwant it to contain\n\t%s", msg, want)
	}
	if strings.Contains(msg, "padding") || strings.Contains(msg, "CREATE TABLE fine") {
		t.Errorf("the error repeats the SQL file: %s", msg)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42601" {
		t.Errorf("the error does not wrap the PostgreSQL error: %#v", err)
	}

	// The first migration stays applied, and nothing of the broken one.
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var first, fine bool
	err = conn.QueryRow(t.Context(),
		`SELECT to_regclass('first') IS NOT NULL, to_regclass('fine') IS NOT NULL`).Scan(&first, &fine)
	if err != nil || !first || fine {
		t.Errorf("table first exists: %t, table fine exists: %t (%v); want true, false", first, fine, err)
	}
}

// emptyDatabase creates a database without any migration for the calling test
// and drops it when the test ends.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	admin := pgtest.AdminURL(t)
	name := "payments_test_migrations_empty_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	exec := func(sql string) error {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), sql)
		return err
	}
	if err := exec("CREATE DATABASE " + name + " " + migrations.CreateDatabaseOptions); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
