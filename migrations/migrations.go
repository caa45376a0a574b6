// Package migrations holds the numbered SQL migrations, embedded into the binary,
// and runs them with golang-migrate.
package migrations

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// scheme
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed *.sql
var files embed.FS

// CreateDatabaseOptions are the options for CREATE DATABASE that the schema
// needs: UTF8 text whatever the server's default encoding (jsonb cannot hold
// non-ASCII \u escapes otherwise), with the C locale, which suits any
// encoding. The first migration refuses a database in another encoding.
const CreateDatabaseOptions = "TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"

// Up applies every migration not yet applied to the database at databaseURL
// (a postgres:// URL). It returns nil when the schema is already current. When
// a migration fails, the error names it and gives PostgreSQL's cause first.
func Up(databaseURL string) error {
	return up(databaseURL, files)
}

// up is Up with the migrations in fsys.
func up(databaseURL string, fsys fs.FS) error {
	return run(databaseURL, fsys, func(m *migrate.Migrate) error {
		err := m.Up()
		if !isRunError(err) {
			return err
		}
		// The failed migration left the schema dirty at its own version.
		version, _, verr := m.Version()
		if verr != nil {
			return err
		}
		return failure(fsys, version, source.Up, err)
	})
}

// Down reverts the most recent migration. It returns nil when none is applied.
// When the migration fails, the error names it and gives the cause first.
func Down(databaseURL string) error {
	return run(databaseURL, files, func(m *migrate.Migrate) error {
		before, _, verr := m.Version()
		err := m.Steps(-1)
		if !isRunError(err) || verr != nil {
			return err
		}
		return failure(files, before, source.Down, err)
	})
}

// Errors of Up, Down and Force.
var (
	// ErrDirty: a migration failed part-way and left the schema dirty. No
	// migration runs until the database is repaired by hand and its version
	// recorded with Force.
	ErrDirty = errors.New("the schema is dirty")
	// ErrUnknownVersion: Force was given a version no migration has.
	ErrUnknownVersion = errors.New("no such migration")
)

// Force records version as the schema's version, clean, and runs no
// migration: the way out after a failed migration left the schema dirty
// (ErrDirty) and an operator repaired the database by hand to match version.
// version is one of the migrations' (CheckVersion), or -1 for none applied.
func Force(databaseURL string, version int) error {
	if err := CheckVersion(version); err != nil {
		return err
	}
	return run(databaseURL, files, func(m *migrate.Migrate) error { return m.Force(version) })
}

// CheckVersion returns nil when Force may record version: -1 (no migration
// applied) or the version of one of the migrations. It returns
// ErrUnknownVersion otherwise.
func CheckVersion(version int) error {
	if version == -1 {
		return nil
	}
	var versions []uint
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return fmt.Errorf("read embedded migrations: %w", err)
	}
	for _, e := range entries {
		m, err := source.Parse(e.Name())
		if err != nil || m.Direction != source.Up {
			continue
		}
		if int(m.Version) == version {
			return nil
		}
		versions = append(versions, m.Version)
	}
	if len(versions) == 0 {
		return fmt.Errorf("%w %d: there are no migrations; want -1", ErrUnknownVersion, version)
	}
	return fmt.Errorf("%w %d: want -1 (none applied) or a migration's version, %d to %d",
		ErrUnknownVersion, version, slices.Min(versions), slices.Max(versions))
}

// Version reports the schema version of the database and whether a failed
// migration left it dirty. A database without migrations has version 0.
func Version(databaseURL string) (version uint, dirty bool, err error) {
	err = run(databaseURL, files, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		return err
	})
	return version, dirty, err
}

// run opens the migrations in fsys against the database and runs step.
func run(databaseURL string, fsys fs.FS, step func(*migrate.Migrate) error) error {
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, pgx5URL(databaseURL))
	if err != nil {
		return fmt.Errorf("connect for migrations: %w", err)
	}
	defer m.Close()
	err = step(m)
	if errors.Is(err, migrate.ErrNoChange) || errors.Is(err, migrate.ErrNilVersion) || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var dirty migrate.ErrDirty
	if errors.As(err, &dirty) {
		return fmt.Errorf("migrate: %w at version %d: a migration failed part-way", ErrDirty, dirty.Version)
	}
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// pgx5URL rewrites a postgres:// or postgresql:// URL to the scheme
// golang-migrate's pgx v5 driver registers.
func pgx5URL(u string) string {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if strings.HasPrefix(u, scheme) {
			return "pgx5://" + strings.TrimPrefix(u, scheme)
		}
	}
	return u
}

// isRunError reports whether err is a migration's SQL failing. golang-migrate's
// pgx driver returns those as a database.Error value; its bookkeeping failures
// (the version table, the lock) come as pointers.
func isRunError(err error) bool {
	var dbErr database.Error
	return errors.As(err, &dbErr)
}

// failure names the migration file that failed and gives the cause first:
//
//	migration 2 (0002_broken.up.sql) failed: ERROR: syntax error at or near "TABLEX" (SQLSTATE 42601) at line 4: CREATE TABLEX broken (id int);
//
// golang-migrate's own message puts the whole SQL file before its cause. The
// returned error wraps the driver's (a *pgconn.PgError for SQL errors).
func failure(fsys fs.FS, version uint, direction source.Direction, err error) error {
	var dbErr database.Error
	if !errors.As(err, &dbErr) {
		return err
	}
	name := fileName(fsys, version, direction)
	cause := dbErr.OrigErr
	if cause == nil {
		return fmt.Errorf("migration %d (%s) failed: %s", version, name, dbErr.Err)
	}
	var where string
	var pgErr *pgconn.PgError
	if errors.As(cause, &pgErr) {
		if pgErr.Detail != "" {
			where = " (" + pgErr.Detail + ")"
		}
		if pgErr.Position > 0 && dbErr.Line > 0 {
			where += fmt.Sprintf(" at line %d: %s", dbErr.Line, lineOf(dbErr.Query, dbErr.Line))
		}
	}
	return fmt.Errorf("migration %d (%s) failed: %w%s", version, name, cause, where)
}

// fileName is the name of the migration file for version and direction in
// fsys, or a placeholder when there is none.
func fileName(fsys fs.FS, version uint, direction source.Direction) string {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return "file unknown"
	}
	for _, e := range entries {
		m, err := source.Parse(e.Name())
		if err == nil && m.Version == version && m.Direction == direction {
			return e.Name()
		}
	}
	return "file unknown"
}

// lineOf returns line n (counted from 1) of sql, trimmed.
func lineOf(sql []byte, n uint) string {
	lines := strings.Split(strings.ReplaceAll(string(sql), "\r\n", "\n"), "\n")
	if n == 0 || int(n) > len(lines) {
		return ""
	}
	return strings.TrimSpace(lines[n-1])
}
