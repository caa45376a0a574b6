package postgres

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// One round trip for a whole transaction.
//
// A transaction run statement by statement (inTx) costs a round trip for its
// BEGIN, one for each statement and one for its COMMIT: each a write and a
// read on the connection, which in the card charges' profile was the largest
// share of the service's CPU (docs/benchmarks.md). A transaction that needs
// no answer of one statement to build the next, and that may commit whatever
// its statements did (a compare-and-set that matched nothing wrote nothing),
// goes as one pipeline instead: BEGIN, its statements and COMMIT sent at once
// and answered at once. PostgreSQL runs them in order in one transaction; a
// statement that fails makes it skip the rest, COMMIT included, and the
// transaction is rolled back here. The COMMIT is what durable.go says of
// every commit: on no request's context, bounded by CommitWait, and a WARNING
// during it (a cancelled wait for the standby) makes its outcome unknown.

// errCommitRolledBack is a COMMIT PostgreSQL answered with ROLLBACK: the
// transaction had failed.
var errCommitRolledBack = errors.New("commit answered ROLLBACK")

// pipelined runs stmts in one transaction in one round trip; read reads
// their results, in order, from br (one Exec, QueryRow or Query per
// statement). The COMMIT was sent with them: an error of read's own (a scan)
// comes after the statements committed, so read only scans. It retries a
// deadlock or a serialization failure as inTxRetried does.
func (s *db) pipelined(ctx context.Context, stmts []*pgx.QueuedQuery, read func(br pgx.BatchResults) error) error {
	return retried(func() error { return s.pipelinedOnce(ctx, stmts, read) })
}

func (s *db) pipelinedOnce(ctx context.Context, stmts []*pgx.QueuedQuery, read func(br pgx.BatchResults) error) error {
	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	defer s.transactionEnded()
	// The pipeline ends with the commit: the request's context must not
	// cancel it (durable.go).
	return s.durably(ctx, conn.Conn().PgConn(), func(commitCtx context.Context) error {
		begin := &pgx.QueuedQuery{SQL: "BEGIN"}
		err := execThenCommit(commitCtx, conn, slices.Concat([]*pgx.QueuedQuery{begin}, stmts), func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				return err
			}
			return read(br)
		})
		if rolledBack(ctx, conn) && err == nil {
			err = errors.New("pipelined transaction left open")
		}
		return err
	})
}

// execThenCommit sends stmts and COMMIT on conn at once; read reads the
// results of stmts, in order. It fails when a statement did, or when COMMIT
// did not commit; the transaction is then left open (aborted), for
// rolledBack.
func execThenCommit(ctx context.Context, conn *pgxpool.Conn, stmts []*pgx.QueuedQuery, read func(pgx.BatchResults) error) error {
	b := &pgx.Batch{QueuedQueries: slices.Concat(stmts, []*pgx.QueuedQuery{{SQL: "COMMIT"}})}
	br := conn.SendBatch(ctx, b)
	err := read(br)
	if err == nil {
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil && tag.String() != "COMMIT" {
			err = errCommitRolledBack
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// rolledBack rolls back the transaction left open on conn, if any (a
// statement failed, or nothing committed it), and reports whether there was
// one. If the rollback fails, Release closes the connection.
func rolledBack(ctx context.Context, conn *pgxpool.Conn) bool {
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = conn.Exec(rctx, "ROLLBACK")
	return true
}

// retried runs run, and again up to maxAttempts in all while it fails with
// a deadlock or a serialization failure.
func retried(run func() error) error {
	err := run()
	for attempt := 2; retryable(err) && attempt <= maxAttempts; attempt++ {
		err = run()
	}
	return err
}
