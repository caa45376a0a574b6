package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
)

// ChargeDB is the charge path's SQL behind the port its use case declares
// (chargedb.Store); the use case itself, the batcher, the retries and the
// decisions, is internal/charging's. Its statements are in chargesql.go
// (round trip 1, lockBatch) and chargewrite.go (round trip 2, writeBatch).
type ChargeDB struct {
	*db
	chargeSQL chargeStatements
}

var _ chargedb.Store = (*ChargeDB)(nil)

// Ping checks that the database answers as a primary (DB.Ping).
func (s *ChargeDB) Ping(ctx context.Context) error { return s.ping(ctx) }

// Lock begins a batch's transaction on a pooled connection and runs its
// first round trip (lockBatch); see chargedb.Store.
func (s *ChargeDB) Lock(ctx context.Context, reqs []chargedb.KeyedCharge, w chargedb.Waits) (chargedb.Tx, *chargedb.Locks, error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, nil, chargeErr(err)
	}
	tx := &chargeTx{s: s, ctx: ctx, conn: conn}
	locks, err := s.lockBatch(ctx, conn, reqs, w)
	if err != nil {
		tx.Close()
		return nil, nil, chargeErr(err)
	}
	return tx, locks, nil
}

// chargeTx is a batch's transaction on its connection, between Lock and
// Close.
type chargeTx struct {
	s    *ChargeDB
	ctx  context.Context
	conn *pgxpool.Conn
	done bool // committed, or closed
}

// Commit writes w and commits (writeBatch), and wakes the relay when the
// batch wrote events.
func (tx *chargeTx) Commit(ctx context.Context, w *chargedb.Writes) (time.Time, error) {
	if tx.done {
		return time.Time{}, fmt.Errorf("charge transaction already ended")
	}
	storedAt, err := tx.s.writeBatch(ctx, tx.conn, w)
	tx.s.transactionEnded()
	if err != nil {
		return time.Time{}, chargeErr(err)
	}
	tx.done = true
	tx.conn.Release()
	if len(w.Charges) > 0 {
		tx.s.eventsCommitted()
	}
	return storedAt, nil
}

// Close rolls back a transaction that did not commit and releases its
// connection.
func (tx *chargeTx) Close() {
	if tx.done {
		return
	}
	tx.done = true
	rollback(tx.ctx, tx.conn)
	tx.conn.Release()
	tx.s.transactionEnded()
}

// chargeErr is err as the port names it: chargedb.ErrConflict after which
// the transaction may simply run again, chargedb.ErrDuplicate for a key row
// that appeared under it, payment.ErrUnavailable when the database is not
// there (asUnavailable); other errors pass through.
func chargeErr(err error) error {
	switch {
	case retryable(err):
		return fmt.Errorf("%w: %w", chargedb.ErrConflict, err)
	case hasCode(err, codeUniqueViolation):
		return fmt.Errorf("%w: %w", chargedb.ErrDuplicate, err)
	}
	return asUnavailable(err)
}
