package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/payments/internal/payment"
)

// outboxLockKey is the advisory lock that makes one relay the leader.
const outboxLockKey = 0x7061796d_6f757462 // "paymoutb"

// notifyChannel is the channel the store notifies after events commit.
const notifyChannel = "payments_events"

// OutboxLease is the relay leader's hold on the outbox (payment.OutboxLease):
// a dedicated connection holding a session advisory lock and listening for new
// events. If the connection dies, PostgreSQL releases the lock and a standby
// takes over.
//
// What has been published is a cursor (migration 0008): the position in feed
// order of the last event published, one row that only the lease holder
// writes, once per published batch. Events are never written after their
// insert.
type OutboxLease struct {
	conn       *pgx.Conn
	commitWait time.Duration
	cursor     position   // the last event published
	read       []position // the positions of what Unpublished last returned
}

// position is an event's place in feed order.
type position struct {
	txID pgtype.Uint64 // xid8
	seq  int64
	id   uuid.UUID
}

// relayStream names the relay's row of outbox_cursor.
const relayStream = "relay"

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
	l := &OutboxLease{conn: conn, commitWait: s.opts.CommitWait}
	// Read after the lock is held: no other relay moves it from now on.
	if err := conn.QueryRow(ctx, `SELECT tx_id, seq FROM outbox_cursor WHERE stream = $1`, relayStream).
		Scan(&l.cursor.txID, &l.cursor.seq); err != nil {
		_ = conn.Close(ctx)
		return nil, asUnavailable(fmt.Errorf("read the outbox cursor: %w", err))
	}
	return l, nil
}

// Close gives the lease up.
func (l *OutboxLease) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.conn.Close(ctx) // closing the session releases the lock
}

// unpublishedSQL reads the events after the cursor ($3, $4) and below the
// event horizon ($2, read by the statement before: horizon.go) in feed order
// (see migration 0002): a slow transaction's events are never overtaken and
// then forgotten, since none can appear below the horizon, behind the cursor.
const unpublishedSQL = `
SELECT merchant_id, id, type, payload, created_at, tx_id, seq
FROM events
WHERE (tx_id, seq) > ($3::xid8, $4::bigint)
  AND tx_id < $2::xid8
ORDER BY tx_id, seq
LIMIT $1`

// Unpublished returns up to limit events to publish, oldest first.
func (l *OutboxLease) Unpublished(ctx context.Context, limit int) ([]payment.OutboxEvent, error) {
	h, err := eventHorizon(ctx, l.conn)
	if err != nil {
		return nil, err
	}
	rows, err := l.conn.Query(ctx, unpublishedSQL, limit, h.xid, l.cursor.txID, l.cursor.seq)
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("select unpublished events: %w", err))
	}
	l.read = l.read[:0]
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.OutboxEvent, error) {
		var e payment.OutboxEvent
		var p position
		err := row.Scan(&e.MerchantID, &e.ID, &e.Type, &e.Data, &e.CreatedAt, &p.txID, &p.seq)
		p.id = e.ID
		l.read = append(l.read, p)
		return e, err
	})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("select unpublished events: %w", err))
	}
	if len(events) > 0 {
		// Nothing is published that a failover could still lose (durable.go).
		if _, err := confirm(ctx, l.conn, l.commitWait); err != nil {
			return nil, err
		}
	}
	return events, nil
}

// markPublishedSQL moves the cursor forward, never back.
const markPublishedSQL = `
UPDATE outbox_cursor SET tx_id = $2::xid8, seq = $3::bigint, moved_at = now()
WHERE stream = $1 AND (tx_id, seq) < ($2::xid8, $3::bigint)`

// MarkPublished records that the broker has the events: a prefix, in order,
// of what Unpublished last returned. It moves the cursor to the last of them,
// one write however many they are.
func (l *OutboxLease) MarkPublished(ctx context.Context, events []payment.OutboxEvent) error {
	if len(events) == 0 {
		return nil
	}
	if len(events) > len(l.read) {
		return fmt.Errorf("mark %d events published: only %d were read", len(events), len(l.read))
	}
	for i, e := range events {
		if e.ID != l.read[i].id {
			return fmt.Errorf("mark events published: event %d is not the one read there", i)
		}
	}
	last := l.read[len(events)-1]
	if _, err := l.conn.Exec(ctx, markPublishedSQL, relayStream, last.txID, last.seq); err != nil {
		return asUnavailable(fmt.Errorf("mark events published: %w", err))
	}
	l.cursor = last
	l.read = l.read[:copy(l.read, l.read[len(events):])]
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

// pruneSQL deletes a bounded batch of the oldest events in feed order, at or
// behind the cursor ($3, $4), that were created longer ago than the
// retention, so pruning never holds long locks, never bloats one transaction
// and never touches an event still to be read. It walks the order index from
// its start and stops at the first event not old enough (an older one behind
// it goes next time). Webhooks read the events they deliver at each attempt
// (docs/webhooks.md), so it also spares the events at or after the cursor of
// a live enabled endpoint of their merchant (not yet fanned out) and those
// with a pending delivery to one; the batch counts them, so they are
// skipped, not waited for.
const pruneSQL = `
DELETE FROM events
WHERE (merchant_id, id) IN (
    SELECT merchant_id, id FROM (
        SELECT merchant_id, id, created_at, tx_id, seq FROM events
        WHERE (tx_id, seq) <= ($3::xid8, $4::bigint)
        ORDER BY tx_id, seq
        LIMIT $2
    ) AS oldest
    WHERE created_at < now() - $1::interval
      AND NOT EXISTS (
        SELECT FROM webhook_endpoints e
        WHERE e.merchant_id = oldest.merchant_id AND e.deleted_at IS NULL AND e.status = 'enabled'
          AND (oldest.tx_id, oldest.seq) >= (e.cursor_tx, e.cursor_seq))
      AND NOT EXISTS (
        SELECT FROM webhook_deliveries d
        JOIN webhook_endpoints e ON e.merchant_id = d.merchant_id AND e.id = d.endpoint_id
        WHERE d.merchant_id = oldest.merchant_id AND d.event_id = oldest.id AND d.state = 'pending'
          AND e.deleted_at IS NULL AND e.status = 'enabled')
)`

// Prune deletes up to batch published events created more than retention
// ago and reports how many it deleted.
func (l *OutboxLease) Prune(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	tag, err := l.conn.Exec(ctx, pruneSQL, retention, batch, l.cursor.txID, l.cursor.seq)
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
FROM unpublished_events`

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
