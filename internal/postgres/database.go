package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnsureDatabase creates the database named in url (the setting called
// name, for the messages) with options when the server reports it does not
// exist, so a newcomer needs no psql to get started; it says so on log. It
// returns an error naming the setting when url is invalid, the server
// cannot be reached, or the database cannot be created.
func EnsureDatabase(ctx context.Context, name, url, options string, log io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("invalid %s: %w", name, err)
	}
	if cfg.ConnectTimeout == 0 {
		// A host that drops packets costs one attempt 5 s, not the whole wait.
		cfg.ConnectTimeout = 5 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to %s: %w", name, err)
	}
	database := cfg.Database
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database %q does not exist, and connecting to database postgres to create it failed: %w", database, err)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{database}.Sanitize()+" "+options)
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		// Created meanwhile, by another replica migrating at the same time,
		// or already there but not yet replayed on the standby that a
		// multi-host URL tried first (pgx stops at its "does not exist").
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", database, err)
	}
	fmt.Fprintf(log, "created database %q\n", database)
	return nil
}
