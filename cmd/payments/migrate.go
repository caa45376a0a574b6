package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/migrations"
)

const migrateUsage = `usage:
  payments migrate up [flags]              apply every migration not yet applied (waits MIGRATE_WAIT for PostgreSQL)
  payments migrate down [flags]            revert the most recent migration
  payments migrate version [flags]         print the schema version, and whether a failed migration left it dirty
  payments migrate force VERSION [flags]   record VERSION as applied and clean, running nothing: after a failed
                                           migration, once the database has been repaired by hand to match VERSION
                                           (-1: none applied)

Each takes --database-url ($DATABASE_URL); "payments migrate up -h" lists every setting up reads.`

// migrate applies, reverts, reports or forces the schema version, then prints
// it. "up" first waits up to MIGRATE_WAIT for PostgreSQL to accept
// connections, as it may still be starting next to the service (docker
// compose up).
func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("missing migrate command\n%s", migrateUsage)
	}
	if isHelp(args[0]) {
		_, err := fmt.Fprintln(stdout, migrateUsage)
		return err
	}
	cmd, rest := args[0], args[1:]
	var force string // force's VERSION, before the flags, so that -1 is not taken for one
	if cmd == "force" && len(rest) > 0 && !isHelp(rest[0]) {
		force, rest = rest[0], rest[1:]
	}
	switch cmd {
	case "up", "down", "force", "version":
	default:
		return fmt.Errorf("unknown migrate command %q\n%s", cmd, migrateUsage)
	}
	name := "migrate " + cmd
	cfg, err := loadConfig(name, rest, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	switch cmd {
	case "up":
		if err := waitForDatabase(ctx, cfg.DatabaseURL, cfg.MigrateWait, stderr); err != nil {
			return err
		}
		err = migrations.Up(cfg.DatabaseURL)
	case "down":
		err = migrations.Down(cfg.DatabaseURL)
	case "force":
		err = forceVersion(cfg.DatabaseURL, force, stderr)
	}
	if errors.Is(err, migrations.ErrDirty) {
		return fmt.Errorf("%w; repair the database by hand to match a version N, then run: payments migrate force N", err)
	}
	if err != nil {
		return err
	}
	version, dirty, err := migrations.Version(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	if cmd != "version" {
		if err := confirmCommitted(ctx, cfg); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	_, err = fmt.Fprintf(stdout, "schema version %d (dirty: %t)\n", version, dirty)
	return err
}

// confirmCommitted returns once the synchronous standby, if there is one,
// has everything committed so far: a migration's commit whose wait for it
// was cancelled is on the primary alone, and a failover would take back the
// version this command reports (internal/postgres/durable.go).
func confirmCommitted(ctx context.Context, cfg config) error {
	db, err := postgres.Connect(ctx, cfg.DatabaseURL, storeOptions(cfg))
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Confirm(ctx)
}

// forceVersion records arg, a migration's version or -1, as the schema's
// version (migrations.Force), after a warning on stderr that names the
// version it replaces. A bad arg fails before the warning and changes nothing.
func forceVersion(databaseURL, arg string, stderr io.Writer) error {
	if arg == "" {
		return errors.New("migrate force: name the version: payments migrate force VERSION")
	}
	version, err := strconv.Atoi(arg)
	if err != nil || version < -1 {
		return fmt.Errorf("migrate force: invalid VERSION %q: want a migration's version, or -1 for none", arg)
	}
	if err := migrations.CheckVersion(version); err != nil {
		return fmt.Errorf("migrate force: %w", err)
	}
	before, dirty, err := migrations.Version(databaseURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "WARNING: migrate force records schema version %d as applied and clean (it was %d, dirty: %t).\n"+
		"It runs no migration and changes no table: the database must already match version %d, repaired by hand,\n"+
		"or the next migrate up or down runs against a schema it does not expect.\n", version, before, dirty, version)
	return migrations.Force(databaseURL, version)
}

// retryInterval is the pause between two attempts of waitForDatabase.
const retryInterval = time.Second

// waitForDatabase runs ensureDatabase until it succeeds, fails in a way that
// waiting cannot fix (a wrong password, an SQL error), or wait has passed. Each
// wait prints one line naming the server and the cause.
func waitForDatabase(ctx context.Context, databaseURL string, wait time.Duration, stderr io.Writer) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	server := net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	deadline := time.Now().Add(wait)
	for {
		err := ensureDatabase(ctx, databaseURL, stderr)
		if err == nil || !notYetReachable(ctx, err) {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("PostgreSQL at %s did not accept connections within %s (MIGRATE_WAIT): %w", server, wait, err)
		}
		fmt.Fprintf(stderr, "waiting for PostgreSQL at %s: %s\n", server, connectCause(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for PostgreSQL at %s: %w", server, ctx.Err())
		case <-time.After(min(retryInterval, left)):
		}
	}
}

// notYetReachable reports whether err is a server that is not there yet: its
// port refuses or times out, its name does not resolve yet (a container still
// starting), or it answers that it is starting up (SQLSTATE 57P03).
func notYetReachable(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P03" // cannot_connect_now
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) ||
		errors.As(err, &opErr) && opErr.Op == "dial" ||
		errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
}

// connectCause is the innermost part of a connection error worth a line:
// "connect: connection refused", not the driver's whole account.
func connectCause(err error) string {
	var pgErr *pgconn.PgError
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	case errors.As(err, &dnsErr):
		return dnsErr.Error()
	case errors.As(err, &opErr) && opErr.Err != nil:
		return opErr.Err.Error()
	}
	return err.Error()
}

// ensureDatabase creates the database named in databaseURL when the server
// reports it does not exist, so a newcomer needs no psql to get started.
func ensureDatabase(ctx context.Context, databaseURL string, stderr io.Writer) error {
	return postgres.EnsureDatabase(ctx, "DATABASE_URL", databaseURL, migrations.CreateDatabaseOptions, stderr)
}
