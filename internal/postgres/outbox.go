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
	pruned     position   // where the pass of pruning got to (Prune)
	// ended tells the store's confirmation rounds that a transaction of the
	// lease ended (db.transactionEnded).
	ended func()
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
	l := &OutboxLease{conn: conn, commitWait: s.opts.CommitWait, pruned: passStart, ended: s.transactionEnded}
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
		confirmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.commitWait)
		_, err := confirm(confirmCtx, l.conn, confirmTxSQL)
		cancel()
		l.ended()
		if err != nil {
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
	_, err := l.conn.Exec(ctx, markPublishedSQL, relayStream, last.txID, last.seq)
	l.ended()
	if err != nil {
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

// pruneSQL is one batch of a pass of pruning (Prune): it takes the next $2
// events in feed order after the pass's position ($5, $6) and at or behind
// the relay's cursor ($3, $4), through events_order and never more, so
// pruning holds no long lock, bloats no transaction and never touches an
// event still to be published. Of those, it deletes the ones created longer
// ago than the retention ($1) but those webhooks still need, as they read an
// event at each attempt (docs/webhooks.md): the events at or after the cursor
// of a live enabled endpoint of their merchant (not yet fanned out), and
// those with a pending delivery to one. It returns how many it deleted, how
// many it took, whether one of them was too young, and the position of the
// last one taken (NULL if none).
const pruneSQL = `
WITH taken AS (
    SELECT merchant_id, id, created_at, tx_id, seq FROM events
    WHERE (tx_id, seq) > ($5::xid8, $6::bigint)
      AND (tx_id, seq) <= ($3::xid8, $4::bigint)
    ORDER BY tx_id, seq
    LIMIT $2
), pruned AS (
    DELETE FROM events e USING taken t
    WHERE e.merchant_id = t.merchant_id AND e.id = t.id
      AND t.created_at < now() - $1::interval
      AND NOT EXISTS (
        SELECT FROM webhook_endpoints w
        WHERE w.merchant_id = t.merchant_id AND w.deleted_at IS NULL AND w.status = 'enabled'
          AND (t.tx_id, t.seq) >= (w.cursor_tx, w.cursor_seq))
      AND NOT EXISTS (
        SELECT FROM webhook_deliveries d
        JOIN webhook_endpoints w ON w.merchant_id = d.merchant_id AND w.id = d.endpoint_id
        WHERE d.merchant_id = t.merchant_id AND d.event_id = t.id AND d.state = 'pending'
          AND w.deleted_at IS NULL AND w.status = 'enabled')
    RETURNING 1
), last AS (
    SELECT tx_id, seq FROM taken ORDER BY tx_id DESC, seq DESC LIMIT 1
)
SELECT (SELECT count(*) FROM pruned), count(*), coalesce(bool_or(created_at >= now() - $1::interval), false),
       (SELECT tx_id FROM last), (SELECT seq FROM last)
FROM taken`

// passStart is the position a pass of pruning starts after: before every
// event, as no transaction has the id 0.
var passStart = position{txID: pgtype.Uint64{Valid: true}}

// Prune deletes a batch of the published events created more than retention
// ago, and reports how many it deleted and whether the pass goes on. A pass
// walks the published events in feed order, batch by batch, from the oldest,
// and remembers where the last batch ended: the events spared for webhooks
// are walked past, not stopped at, so however many of them there are, the
// other merchants' aged events behind them go in the same pass. A pass ends
// at a batch that took an event too young (those after it wait for the next
// pass, which starts from the oldest again) or reached the relay's cursor.
// The error wraps payment.ErrUnavailable when the database is unreachable.
func (l *OutboxLease) Prune(ctx context.Context, retention time.Duration, batch int) (deleted int64, more bool, err error) {
	var (
		taken int64
		young bool
		last  position
		seq   *int64
	)
	err = l.conn.QueryRow(ctx, pruneSQL, retention, batch, l.cursor.txID, l.cursor.seq, l.pruned.txID, l.pruned.seq).
		Scan(&deleted, &taken, &young, &last.txID, &seq)
	l.ended()
	if err != nil {
		return 0, false, asUnavailable(fmt.Errorf("prune events: %w", err))
	}
	if young || taken < int64(batch) || seq == nil {
		l.pruned = passStart
		return deleted, false, nil
	}
	last.seq = *seq
	l.pruned = last
	return deleted, true, nil
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
