package postgres

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/payment"
)

// What a commit acknowledges, with a synchronous standby.
//
// With synchronous replication (synchronous_standby_names set, as Patroni's
// synchronous mode does), COMMIT returns once the standby has the commit
// record, so a failover to that standby loses nothing acknowledged. But when
// that wait is cancelled (a cancel request, a terminated backend; not a
// statement_timeout, which PostgreSQL disarms before it commits) PostgreSQL
// ends it with only a WARNING: the transaction
// is committed locally and COMMIT still reports success, although the standby
// may not have it. A failover then loses a charge whose 201 was sent, and the
// retry charges again under a new id.
//
// So, here:
//
//   - A commit runs on no request's context (commitContext): a client that goes
//     away does not cancel the replication wait. Its own bound, CommitWait, is
//     what a standby that stopped acknowledging costs a request.
//   - Any WARNING during the commit's round trip (a plain COMMIT emits none)
//     makes the outcome unknown: errNotConfirmed, which is
//     payment.ErrUnavailable, a 503 the client retries with its key. The
//     language of the message does not matter, only its severity.
//   - An answer read from what an earlier transaction stored (a replayed
//     response, the event feed, the relay's next events) is given only after
//     a commit of this service's own is confirmed after it (confirmSQL): the
//     standby receives the write-ahead log in order, so once it confirms a
//     later commit, it has every earlier one. A row committed locally after a
//     cancelled wait is thus never replayed as success until it is on the
//     standby; while the standby is away, its retries answer 503.
//
// Without synchronous_standby_names none of this waits for anything:
// confirmSQL then writes nothing, and its COMMIT has nothing to wait for.

// warningKey is where onNotice keeps a connection's last WARNING, in the
// connection's CustomData (each connection is used by one goroutine at a time,
// the one reading its results, which is where notices are delivered).
const warningKey = "payments.warning"

// onNotice is every connection's notice handler: it remembers WARNINGs.
func onNotice(c *pgconn.PgConn, n *pgconn.Notice) {
	severity := n.SeverityUnlocalized
	if severity == "" { // servers before 9.6 send only the localized one
		severity = n.Severity
	}
	if severity == "WARNING" {
		c.CustomData()[warningKey] = n
	}
}

// takeWarning returns and forgets the last WARNING c received, or nil.
func takeWarning(c *pgconn.PgConn) *pgconn.Notice {
	n, _ := c.CustomData()[warningKey].(*pgconn.Notice)
	delete(c.CustomData(), warningKey)
	return n
}

// errNotConfirmed is a commit whose durability on the standby is unknown.
func errNotConfirmed(n *pgconn.Notice) error {
	return fmt.Errorf("%w: commit not confirmed (WARNING %s: %s %s)", payment.ErrUnavailable, n.Code, n.Message, n.Detail)
}

// confirmSQL, inside a transaction, makes its COMMIT wait for the synchronous
// standby when there is one. It writes the smallest record there is to the
// write-ahead log, a transactional logical message (which any role may emit,
// at wal_level replica too): PostgreSQL waits for the standby only at the
// commit of a transaction that wrote some, and a transaction id alone writes
// none (checked on the HA cluster: with the standby's acknowledgements
// stopped, BEGIN; SELECT pg_current_xact_id(); COMMIT returns at once, and
// this does not).
const confirmSQL = `
SELECT CASE WHEN current_setting('synchronous_standby_names') <> ''
            THEN pg_logical_emit_message(true, 'payments', 'confirm') END`

// confirmTxSQL is confirmSQL in a transaction of its own, in one round trip:
// first what the transaction sees (its snapshot, all of it committed before
// its own commit), last the transaction it became by writing (none without a
// synchronous standby). Once it commits confirmed, the standby has both.
const confirmTxSQL = `BEGIN; ` + snapshotSQL + `; ` + confirmSQL + `; SELECT pg_current_xact_id_if_assigned()::text; COMMIT`

// Begin begins a transaction on a pooled connection, for a package that
// keeps tables of its own in this database (the consumer's inbox): the
// caller runs its statements, and this package runs none of the caller's
// code. Its Commit is acknowledged only once the synchronous standby, if
// there is one, has it: otherwise payment.ErrUnavailable. A transaction
// that writes nothing commits without waiting: use Confirm for an answer
// that rests on what it read. Rollback ends it and releases its connection,
// after a Commit too (pgx's idiom defers it): call it once done.
func (s *DB) Begin(ctx context.Context) (pgx.Tx, error) {
	k, err := s.beginKeyTx(ctx)
	if err != nil {
		return nil, err
	}
	if k.tx, err = k.conn.Begin(ctx); err != nil {
		k.conn.Release()
		return nil, keyError(fmt.Errorf("begin: %w", err))
	}
	k.q = k.tx
	return &confirmedTx{Tx: k.tx, k: k}, nil
}

// confirmedTx is a pgx.Tx whose Commit is confirmed (keyTx.Commit) and whose
// Rollback releases its connection.
type confirmedTx struct {
	pgx.Tx
	k        *keyTx
	released bool
}

func (t *confirmedTx) Commit(ctx context.Context) error { return t.k.Commit(ctx) }

func (t *confirmedTx) Rollback(context.Context) error {
	if t.released {
		return pgx.ErrTxClosed
	}
	t.released = true
	t.k.Close()
	return nil
}

// inTxRetried is inTx, run again up to maxAttempts in all while it fails
// with a deadlock or a serialization failure: for transactions that lock
// rows another may lock in another order. fn must be safe to run again
// (it starts from what it was given, not from what a failed run left).
func (s *db) inTxRetried(ctx context.Context, fn func(pgx.Tx) error) error {
	return retried(func() error { return s.inTx(ctx, fn) })
}

// Confirm returns once everything committed before it was called is on the
// synchronous standby, if there is one, or payment.ErrUnavailable when that
// is not known within CommitWait. Callers at once share one commit.
func (s *DB) Confirm(ctx context.Context) error { return s.confirmCommitted(ctx) }

// commitContext is the context of a commit's round trip: it ignores ctx's
// cancellation (see above) and is bounded by CommitWait instead.
func (s *db) commitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.opts.CommitWait)
}

// durably runs commit, the round trip on pg that ends with a commit, as this
// file says of every commit: on commitContext, not ctx, and a WARNING during
// it (a cancelled wait for the standby) makes its outcome unknown
// (errNotConfirmed). commit's own error is returned as it is.
func (s *db) durably(ctx context.Context, pg *pgconn.PgConn, commit func(commitCtx context.Context) error) error {
	commitCtx, cancel := s.commitContext(ctx)
	defer cancel()
	takeWarning(pg)
	if err := commit(commitCtx); err != nil {
		return err
	}
	if n := takeWarning(pg); n != nil {
		return errNotConfirmed(n)
	}
	return nil
}

// confirm runs sql, confirmTxSQL (or a test's stand-in for it), on c: it
// returns once everything committed before it was called is on the
// synchronous standby, if there is one, or payment.ErrUnavailable when that is
// not known. It returns what it confirmed: every transaction its snapshot
// sees, and its own. It waits as long as ctx lets it, and ctx's end drops the
// connection (durable.go): the caller bounds it.
func confirm(ctx context.Context, c *pgx.Conn, sql string) (*snapshot, error) {
	takeWarning(c.PgConn())
	results, err := c.PgConn().Exec(ctx, sql).ReadAll()
	if err != nil {
		if c.PgConn().TxStatus() != 'I' && !c.IsClosed() {
			_, _ = c.Exec(ctx, "ROLLBACK") // the outbox lease's connection lives on
		}
		return nil, asUnavailable(fmt.Errorf("confirm commits: %w", err))
	}
	if n := takeWarning(c.PgConn()); n != nil {
		return nil, errNotConfirmed(n)
	}
	// BEGIN, the snapshot, confirmSQL, the transaction, COMMIT.
	if len(results) != 5 || len(results[1].Rows) != 1 || len(results[3].Rows) != 1 {
		return nil, fmt.Errorf("%w: confirm commits: %d results, not 5", payment.ErrUnavailable, len(results))
	}
	snap, err := parseSnapshot(string(results[1].Rows[0][0]))
	if err != nil {
		return nil, fmt.Errorf("%w: confirm commits: %w", payment.ErrUnavailable, err)
	}
	if own := results[3].Rows[0][0]; own != nil {
		if snap.own, err = strconv.ParseUint(string(own), 10, 64); err != nil {
			return nil, fmt.Errorf("%w: confirm commits: its transaction %q: %w", payment.ErrUnavailable, own, err)
		}
	}
	return snap, nil
}
