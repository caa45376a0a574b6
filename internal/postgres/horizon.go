package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The event horizon. The feed (/v1/events) and the relay list only events
// whose transaction id is below it, in (tx_id, seq) order, so that no event
// can appear behind a reader's cursor (migration 0002): every transaction
// below the horizon has ended, and none can start below it.
//
// Which horizon, and why this one. The server's (pg_snapshot_xmin of the
// current snapshot) is the simplest, but every writing transaction of every
// database on the server holds it back, and a neighbour's hour-long batch job
// would stop every payment event for an hour. A commit-ordered stream from
// logical decoding (pgoutput) would be held by nothing but needs
// wal_level=logical and a replication slot, which pins WAL on the primary
// while the relay is down and must be re-created on a new primary after a
// failover (before PostgreSQL 17), and the feed would then page by a position
// the relay assigns, so it would wait for the relay. The per-database horizon
// keeps the schema, the feed's cursor and the failover story, and is held back
// only by transactions that can write this database's events: its backends and
// its prepared transactions. payments_event_horizon() (migration 0007) computes
// it; its comment argues the order of its reads. What it needs from its caller:
// the read that uses the horizon must take its snapshot after the function
// returned, so it runs as a separate statement, after it, at READ COMMITTED.
const horizonSQL = `SELECT horizon, holder_pid, holder_xid, holder_since, now() FROM payments_event_horizon()`

// horizon is a reading of the event horizon, and of what holds it back.
type horizon struct {
	xid pgtype.Uint64 // xid8: events with a lower tx_id may be listed
	// The transaction holding the horizon below every transaction that has
	// started, if one does: its backend's pid (not valid for a prepared
	// transaction), its id, and since when it has run (not valid when the
	// role may not see another role's xact_start).
	holderPID   pgtype.Int4
	holderXID   pgtype.Uint64
	holderSince pgtype.Timestamptz
	now         time.Time
}

// eventHorizon reads the horizon. The caller's next statement, which reads
// events below it, must be a separate one (see horizonSQL).
func eventHorizon(ctx context.Context, q rowQuerier) (horizon, error) {
	var h horizon
	err := q.QueryRow(ctx, horizonSQL).Scan(&h.xid, &h.holderPID, &h.holderXID, &h.holderSince, &h.now)
	if err != nil {
		return horizon{}, asUnavailable(fmt.Errorf("read the event horizon: %w", err))
	}
	return h, nil
}

// rowQuerier is what reads one row: a pool, or a connection of its own (the
// relay's lease, the monitor's).
type rowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// HorizonHolder is the transaction that holds the event horizon back: the
// oldest transaction of this database still running (or prepared) whose
// events, if it writes any, would come before those committed since it began.
type HorizonHolder struct {
	// PID is its backend's process id, 0 for a prepared transaction.
	PID int32
	// XID is its transaction id.
	XID uint64
	// Age is how long it has run (for a prepared transaction: since it was
	// prepared), or -1 when PostgreSQL does not show it to this role (another
	// role's backend, without pg_read_all_stats).
	Age time.Duration
}

func (h horizon) holder() *HorizonHolder {
	if !h.holderXID.Valid {
		return nil
	}
	holder := &HorizonHolder{XID: h.holderXID.Uint64, Age: -1}
	if h.holderPID.Valid {
		holder.PID = h.holderPID.Int32
	}
	if h.holderSince.Valid {
		holder.Age = h.now.Sub(h.holderSince.Time)
	}
	return holder
}
