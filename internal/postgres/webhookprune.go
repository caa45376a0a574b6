package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// webhookPruneLockKey is the advisory lock that lets one prune of the
// webhook record run at a time.
const webhookPruneLockKey = 0x7061796d_77687072 // "paymwhpr"

const (
	// pruneAttemptsSQL deletes a bounded batch of the oldest attempts,
	// those made longer ago than the retention ($1), oldest first
	// (webhook_attempts_by_age, migration 0015).
	pruneAttemptsSQL = `
DELETE FROM webhook_attempts
WHERE (merchant_id, endpoint_id, id) IN (
    SELECT merchant_id, endpoint_id, id FROM webhook_attempts
    WHERE attempted_at < now() - $1::interval
    ORDER BY attempted_at
    LIMIT $2)`

	// pruneSettledSQL deletes a bounded batch of the oldest settled
	// deliveries (any state but pending) created longer ago than the
	// retention ($1), through webhook_deliveries_settled_by_age (migration
	// 0018): every one it reads goes, so nothing stops it. The state is
	// checked again on the row deleted, so a delivery resent meanwhile (made
	// pending again) stays.
	pruneSettledSQL = `
DELETE FROM webhook_deliveries
WHERE state <> 'pending' AND (merchant_id, endpoint_id, event_id) IN (
    SELECT merchant_id, endpoint_id, event_id FROM webhook_deliveries
    WHERE state <> 'pending' AND created_at < now() - $1::interval
    ORDER BY created_at
    LIMIT $2)`

	// prunePendingSQL is one batch of a pass over the pending deliveries: it
	// takes the next $2 created longer ago than the retention ($1), oldest
	// first, after the pass's position ($3 to $6), through
	// webhook_deliveries_pending_by_age (migration 0018) and never more, and
	// deletes those whose endpoint is deleted or disabled; the others are
	// still to be made, and their events are spared for them (outbox.go,
	// pruneSQL). One settled meanwhile goes too. It returns how many it
	// deleted, how many it took, and the last one taken (NULLs if none).
	prunePendingSQL = `
WITH taken AS (
    SELECT merchant_id, endpoint_id, event_id, created_at FROM webhook_deliveries
    WHERE state = 'pending'
      AND (created_at, merchant_id, endpoint_id, event_id) > ($3::timestamptz, $4::uuid, $5::uuid, $6::uuid)
      AND created_at < now() - $1::interval
    ORDER BY created_at, merchant_id, endpoint_id, event_id
    LIMIT $2
), pruned AS (
    DELETE FROM webhook_deliveries d USING taken t
    WHERE d.merchant_id = t.merchant_id AND d.endpoint_id = t.endpoint_id AND d.event_id = t.event_id
      AND (d.state <> 'pending' OR NOT EXISTS (
        SELECT FROM webhook_endpoints e
        WHERE e.merchant_id = d.merchant_id AND e.id = d.endpoint_id
          AND e.deleted_at IS NULL AND e.status = 'enabled'))
    RETURNING 1
), last AS (
    SELECT created_at, merchant_id, endpoint_id, event_id FROM taken
    ORDER BY created_at DESC, merchant_id DESC, endpoint_id DESC, event_id DESC
    LIMIT 1
)
SELECT (SELECT count(*) FROM pruned), (SELECT count(*) FROM taken), l.created_at, l.merchant_id, l.endpoint_id, l.event_id
FROM (SELECT) AS one LEFT JOIN last l ON true`
)

// pendingPass is where the pass over the pending deliveries got to: the
// last one its last batch took, in the order of
// webhook_deliveries_pending_by_age, or that it has ended while attempts or
// settled deliveries still fill their batches. The zero value starts a pass.
type pendingPass struct {
	mu    sync.Mutex
	after deliveryPosition
	ended bool
}

// deliveryPosition is a delivery's place in that order.
type deliveryPosition struct {
	createdAt                 pgtype.Timestamptz
	merchant, endpoint, event pgtype.UUID
}

// pendingPassStart is the position a pass starts after: before every
// delivery.
var pendingPassStart = deliveryPosition{
	createdAt: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
	merchant:  pgtype.UUID{Valid: true}, endpoint: pgtype.UUID{Valid: true}, event: pgtype.UUID{Valid: true},
}

// PruneWebhooks deletes, in one transaction, up to batch attempts made and
// up to batch settled deliveries created longer than retention ago, and the
// pending deliveries as old among the next batch of a pass over them, but
// those to a live enabled endpoint: the webhook record is kept as long as
// the events are (EVENT_RETENTION). The pass walks the aged pending
// deliveries oldest first and remembers where its last batch ended, so the
// ones it keeps are walked past, not stopped at; it ends at a batch that was
// not full, and the next starts from the oldest after a call that had
// nothing more to do. One prune runs at a time across replicas; another
// finds the lock taken and returns at once, having deleted nothing. It
// returns how many rows it deleted, and whether more may be due (a batch was
// full, or the pass goes on), so the caller repeats it. The error wraps
// payment.ErrUnavailable.
func (s *Deliveries) PruneWebhooks(ctx context.Context, retention time.Duration, batch int) (deleted int64, more bool, err error) {
	s.pending.mu.Lock()
	defer s.pending.mu.Unlock()
	after, ended := s.pending.after, s.pending.ended
	if !after.createdAt.Valid {
		after = pendingPassStart
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var leader bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(webhookPruneLockKey)).Scan(&leader); err != nil || !leader {
			return err
		}
		for _, sql := range []string{pruneAttemptsSQL, pruneSettledSQL} {
			tag, err := tx.Exec(ctx, sql, retention, batch)
			if err != nil {
				return err
			}
			deleted += tag.RowsAffected()
			more = more || tag.RowsAffected() == int64(batch)
		}
		if !ended {
			n, next, err := prunePending(ctx, tx, retention, batch, after)
			if err != nil {
				return err
			}
			deleted += n
			if next == nil {
				ended = true
			} else {
				after = *next
			}
		}
		more = more || !ended
		return nil
	})
	if err != nil {
		return 0, false, asUnavailable(fmt.Errorf("prune the webhook record: %w", err))
	}
	if more {
		s.pending.after, s.pending.ended = after, ended
	} else {
		s.pending.after, s.pending.ended = deliveryPosition{}, false
	}
	return deleted, more, nil
}

// prunePending runs a batch of the pass over the pending deliveries from
// after, and returns how many it deleted and where the next batch starts
// after, or nil when the pass has ended.
func prunePending(ctx context.Context, tx pgx.Tx, retention time.Duration, batch int, after deliveryPosition) (int64, *deliveryPosition, error) {
	var n, taken int64
	var last deliveryPosition
	if err := tx.QueryRow(ctx, prunePendingSQL, retention, batch, after.createdAt, after.merchant, after.endpoint, after.event).
		Scan(&n, &taken, &last.createdAt, &last.merchant, &last.endpoint, &last.event); err != nil {
		return 0, nil, err
	}
	if taken < int64(batch) {
		return n, nil, nil
	}
	return n, &last, nil
}
