package benchrun

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Exec runs each statement on database url, in its own implicit transaction
// (CREATE DATABASE, VACUUM and CHECKPOINT refuse to run in one).
func Exec(ctx context.Context, url string, statements ...string) error {
	return withConn(ctx, url, func(conn *pgx.Conn) error {
		for _, s := range statements {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%.60s: %w", s, err)
			}
		}
		return nil
	})
}

// Value is the one text value query returns on database url (SHOW, or a
// SELECT that casts to text).
func Value(ctx context.Context, url, query string, args ...any) (string, error) {
	var v string
	err := withConn(ctx, url, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, query, args...).Scan(&v)
	})
	return v, err
}

// withConn runs fn on a connection of its own to database url.
func withConn(ctx context.Context, url string, fn func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}

// CreateDB creates database name on admin's server as every benchmark
// wants it: from template0, UTF8, the C locale.
func CreateDB(ctx context.Context, admin, name string) error {
	return Exec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'")
}

// DropDB drops database name on admin's server, its sessions with it; it
// is cleanup, so a failure is only returned.
func DropDB(ctx context.Context, admin, name string) error {
	return Exec(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}
