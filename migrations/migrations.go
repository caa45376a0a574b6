// Package migrations holds the numbered SQL migrations, embedded into the binary,
// and runs them with golang-migrate.
package migrations

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// scheme
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

//go:embed *.sql
var files embed.FS

// CreateDatabaseOptions are the options for CREATE DATABASE that the schema
// needs: UTF8 text whatever the server's default encoding (jsonb cannot hold
// non-ASCII \u escapes otherwise), with the C locale, which suits any
// encoding. The first migration refuses a database in another encoding.
const CreateDatabaseOptions = "TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"

// Up applies every migration not yet applied to the database at databaseURL
// (a postgres:// URL). It returns nil when the schema is already current.
func Up(databaseURL string) error {
	return run(databaseURL, func(m *migrate.Migrate) error { return m.Up() })
}

// Down reverts the most recent migration. It returns nil when none is applied.
func Down(databaseURL string) error {
	return run(databaseURL, func(m *migrate.Migrate) error { return m.Steps(-1) })
}

// Version reports the schema version of the database and whether a failed
// migration left it dirty. A database without migrations has version 0.
func Version(databaseURL string) (version uint, dirty bool, err error) {
	err = run(databaseURL, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		return err
	})
	return version, dirty, err
}

func run(databaseURL string, step func(*migrate.Migrate) error) error {
	src, err := iofs.New(files, ".")
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
