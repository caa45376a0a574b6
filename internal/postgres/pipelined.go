package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	err := s.pipelinedOnce(ctx, stmts, read)
	for attempt := 2; retryable(err) && attempt <= maxAttempts; attempt++ {
		err = s.pipelinedOnce(ctx, stmts, read)
	}
	return err
}

func (s *db) pipelinedOnce(ctx context.Context, stmts []*pgx.QueuedQuery, read func(br pgx.BatchResults) error) error {
	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.QueuedQueries = append(b.QueuedQueries, stmts...)
	b.Queue("COMMIT")
	// The pipeline ends with the commit: the request's context must not
	// cancel it (durable.go).
	commitCtx, cancel := s.commitContext(ctx)
	defer cancel()
	pg := conn.Conn().PgConn()
	takeWarning(pg)
	br := conn.SendBatch(commitCtx, b)
	_, err = br.Exec()
	if err == nil {
		err = read(br)
	}
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && tag.String() != "COMMIT" {
			err = errCommitRolledBack
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if pg.TxStatus() != 'I' {
		// A statement failed: the rest were skipped and the transaction
		// is aborted. If the rollback fails, Release closes the connection.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer rcancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
		if err == nil {
			err = fmt.Errorf("pipelined transaction left open (status %q)", pg.TxStatus())
		}
	}
	if err != nil {
		return err
	}
	if n := takeWarning(pg); n != nil {
		return errNotConfirmed(n)
	}
	return nil
}
