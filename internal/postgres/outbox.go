package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"payments/internal/payment"
)

// outboxLockKey is the advisory lock that makes one relay the leader.
const outboxLockKey = 0x7061796d_6f757462 // "paymoutb"

// notifyChannel is the channel the store notifies after events commit.
const notifyChannel = "payments_events"

// OutboxLease is the relay leader's hold on the outbox (payment.OutboxLease):
// a dedicated connection holding a session advisory lock and listening for new
// events. If the connection dies, PostgreSQL releases the lock and a standby
// takes over.
type OutboxLease struct {
	conn       *pgx.Conn
	commitWait time.Duration
}

// ClaimOutbox tries to become the relay leader. It returns
// payment.ErrNotLeader when another process holds the lease, and
// payment.ErrUnavailable when the database cannot be reached.
func (s *Outbox) ClaimOutbox(ctx context.Context) (payment.OutboxLease, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("connect for the outbox lease: %w", err))
	}
	var leader bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(outboxLockKey)).Scan(&leader); err != nil {
		_ = conn.Close(ctx)
		return nil, asUnavailable(fmt.Errorf("take the outbox lock: %w", err))
	}
	if !leader {
		_ = conn.Close(ctx)
		return nil, payment.ErrNotLeader
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		_ = conn.Close(ctx)
		return nil, asUnavailable(fmt.Errorf("listen for events: %w", err))
	}
	return &OutboxLease{conn: conn, commitWait: s.opts.CommitWait}, nil
}

// Close gives the lease up.
func (l *OutboxLease) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.conn.Close(ctx) // closing the session releases the lock
}

// unpublishedSQL reads the oldest unpublished events below the event horizon
// ($2, read by the statement before: horizon.go) in feed order (see migration
// 0002): a slow transaction's events are never overtaken and then forgotten.
const unpublishedSQL = `
SELECT merchant_id, id, type, payload, created_at
FROM events
WHERE published_at IS NULL
  AND tx_id < $2::xid8
ORDER BY tx_id, seq
LIMIT $1`

// Unpublished returns up to limit events to publish, oldest first.
func (l *OutboxLease) Unpublished(ctx context.Context, limit int) ([]payment.OutboxEvent, error) {
	h, err := eventHorizon(ctx, l.conn)
	if err != nil {
		return nil, err
	}
	rows, err := l.conn.Query(ctx, unpublishedSQL, limit, h.xid)
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("select unpublished events: %w", err))
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.OutboxEvent, error) {
		var e payment.OutboxEvent
		err := row.Scan(&e.MerchantID, &e.ID, &e.Type, &e.Data, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("select unpublished events: %w", err))
	}
	if len(events) > 0 {
		// Nothing is published that a failover could still lose (durable.go).
		if err := confirm(ctx, l.conn, l.commitWait); err != nil {
			return nil, err
		}
	}
	return events, nil
}

const markPublishedSQL = `
UPDATE events e SET published_at = now()
FROM unnest($1::uuid[], $2::uuid[]) AS p (merchant_id, id)
WHERE e.merchant_id = p.merchant_id AND e.id = p.id`

// MarkPublished records that the broker has the events.
func (l *OutboxLease) MarkPublished(ctx context.Context, events []payment.OutboxEvent) error {
	merchants := make([]uuid.UUID, len(events))
	ids := make([]uuid.UUID, len(events))
	for i, e := range events {
		merchants[i], ids[i] = e.MerchantID, e.ID
	}
	if _, err := l.conn.Exec(ctx, markPublishedSQL, merchants, ids); err != nil {
		return asUnavailable(fmt.Errorf("mark events published: %w", err))
	}
	return nil
}

// Wait blocks until an event commits, d passes, or ctx ends. A dead
// connection is an error: the lease is lost.
func (l *OutboxLease) Wait(ctx context.Context, d time.Duration) error {
	waitCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := l.conn.WaitForNotification(waitCtx)
	if err != nil && waitCtx.Err() != nil && !l.conn.IsClosed() {
		return nil // timed out or cancelled: poll anyway
	}
	if err != nil {
		return asUnavailable(fmt.Errorf("wait for events: %w", err))
	}
	return nil
}

// pruneSQL deletes a bounded batch of events published longer ago than the
// retention, so pruning never holds long locks or bloats one transaction.
const pruneSQL = `
DELETE FROM events
WHERE (merchant_id, id) IN (
    SELECT merchant_id, id FROM events
    WHERE published_at < now() - $1::interval
    LIMIT $2
)`

// Prune deletes up to batch events published more than retention ago and
// reports how many it deleted.
func (l *OutboxLease) Prune(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	tag, err := l.conn.Exec(ctx, pruneSQL, retention, batch)
	if err != nil {
		return 0, asUnavailable(fmt.Errorf("prune events: %w", err))
	}
	return tag.RowsAffected(), nil
}

// Backlog reports how many events wait to be published, and the age of the
// oldest.
func (s *Outbox) Backlog(ctx context.Context) (count int64, oldest time.Duration, err error) {
	return backlog(ctx, s.pool)
}

const backlogSQL = `
SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
FROM events WHERE published_at IS NULL`

func backlog(ctx context.Context, q rowQuerier) (count int64, oldest time.Duration, err error) {
	var age *float64
	if err := q.QueryRow(ctx, backlogSQL).Scan(&count, &age); err != nil {
		return 0, 0, asUnavailable(fmt.Errorf("outbox backlog: %w", err))
	}
	if age != nil {
		oldest = time.Duration(*age * float64(time.Second))
	}
	return count, oldest, nil
}

// Monitor reads the outbox's state for the metrics on a connection of its own
// (at most one), so sampling never takes a connection from the payments.
type Monitor struct{ pool *pgxpool.Pool }

// OpenMonitor returns a Monitor of the database at databaseURL; it connects
// on first use. It returns an error only for an invalid URL.
func OpenMonitor(ctx context.Context, databaseURL string) (*Monitor, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "payments-metrics"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create monitor pool: %w", err)
	}
	return &Monitor{pool: pool}, nil
}

// OutboxState is a reading of the outbox, for the metrics and the operator.
type OutboxState struct {
	// Backlog is how many events wait to be published, Oldest the age of the
	// oldest of them.
	Backlog int64
	Oldest  time.Duration
	// Held is how long the oldest committed event has waited behind the event
	// horizon (horizon.go): listed by neither the feed nor the relay, because
	// an older transaction of this database still runs. 0 when none waits.
	Held time.Duration
	// Holder is the transaction that holds the horizon back, if one does.
	Holder *HorizonHolder
}

// heldSQL is the age of the oldest committed event at or above the horizon
// ($1, read by the statement before). The relay has not published it (it
// cannot), so the partial index of unpublished events finds it.
const heldSQL = `
SELECT extract(epoch FROM now() - min(created_at))::float8
FROM events WHERE published_at IS NULL AND tx_id >= $1::xid8`

// Outbox reads the backlog and what holds the event horizon back, on the
// monitor's connection.
func (m *Monitor) Outbox(ctx context.Context) (OutboxState, error) {
	var st OutboxState
	var err error
	if st.Backlog, st.Oldest, err = backlog(ctx, m.pool); err != nil {
		return OutboxState{}, err
	}
	h, err := eventHorizon(ctx, m.pool)
	if err != nil {
		return OutboxState{}, err
	}
	var held *float64
	if err := m.pool.QueryRow(ctx, heldSQL, h.xid).Scan(&held); err != nil {
		return OutboxState{}, asUnavailable(fmt.Errorf("events held: %w", err))
	}
	if held != nil {
		st.Held = max(0, time.Duration(*held*float64(time.Second)))
	}
	st.Holder = h.holder()
	return st, nil
}

// Close closes the monitor's connection.
func (m *Monitor) Close() { m.pool.Close() }
