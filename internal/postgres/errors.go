package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/payment"
)

// How the driver's errors are read: the SQLSTATE codes this package acts
// on, what may simply run again, and what means the database is not there.

// SQLSTATE codes this package acts on.
const (
	codeUniqueViolation      = "23505"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeLockNotAvailable     = "55P03"
	codeForeignKeyViolation  = "23503"
	codeReadOnlyTransaction  = "25006"
	codeQueryCanceled        = "57014"
)

func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// hasConstraint reports whether err is code under the named constraint.
func hasConstraint(err error, code, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code && pgErr.ConstraintName == constraint
}

// retryable reports errors after which the whole transaction may simply run again.
func retryable(err error) bool {
	return hasCode(err, codeSerializationFailure) || hasCode(err, codeDeadlockDetected)
}

// asUnavailable turns driver errors meaning "the database is not there right now"
// into payment.ErrUnavailable, keeping the cause for the logs. Other errors pass
// through unchanged.
func asUnavailable(err error) error {
	if err == nil || errors.Is(err, payment.ErrUnavailable) {
		return err
	}
	if unreachable(err) {
		return fmt.Errorf("%w: %w", payment.ErrUnavailable, err)
	}
	return err
}

func unreachable(err error) bool {
	// A connection refused, whatever the server said (too many clients,
	// starting up, a database not accepting connections: 55000), is the
	// database not there for now.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "53"),   // insufficient resources, too many connections
			strings.HasPrefix(pgErr.Code, "57P"),  // admin shutdown, crash shutdown, cannot connect now
			pgErr.Code == codeReadOnlyTransaction, // a primary demoted under the connection
			pgErr.Code == codeQueryCanceled,       // statement_timeout: rolled back, nothing done
			pgErr.Code == codeLockNotAvailable:
			return true
		}
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false // the client went away; nothing to report to it
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.Timeout(err) ||
		strings.Contains(err.Error(), "conn closed")
}
