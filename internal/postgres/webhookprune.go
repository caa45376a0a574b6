package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

	// pruneDeliveriesSQL deletes a bounded batch of the oldest deliveries
	// created longer ago than the retention ($1), but those still pending
	// to a live enabled endpoint: they are still to be made, and their
	// events are spared for them (outbox.go, pruneSQL). The batch counts
	// those, so they are skipped, not waited for.
	pruneDeliveriesSQL = `
DELETE FROM webhook_deliveries
WHERE (merchant_id, endpoint_id, event_id) IN (
    SELECT d.merchant_id, d.endpoint_id, d.event_id FROM (
        SELECT merchant_id, endpoint_id, event_id, state FROM webhook_deliveries
        WHERE created_at < now() - $1::interval
        ORDER BY created_at
        LIMIT $2
    ) d
    WHERE d.state <> 'pending' OR NOT EXISTS (
        SELECT FROM webhook_endpoints e
        WHERE e.merchant_id = d.merchant_id AND e.id = d.endpoint_id
          AND e.deleted_at IS NULL AND e.status = 'enabled'))`
)

// PruneWebhooks deletes, in one transaction, up to batch attempts made and
// up to batch deliveries created longer than retention ago, but the
// deliveries still pending to a live enabled endpoint: the webhook record is
// kept as long as the events are (EVENT_RETENTION). One prune runs at a time
// across replicas; another finds the lock taken and returns at once, having
// deleted nothing. It returns how many rows it deleted, and whether more may
// be due: a batch was full, so the caller repeats it. The error wraps
// payment.ErrUnavailable.
func (s *Deliveries) PruneWebhooks(ctx context.Context, retention time.Duration, batch int) (deleted int64, more bool, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var leader bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(webhookPruneLockKey)).Scan(&leader); err != nil || !leader {
			return err
		}
		for _, sql := range []string{pruneAttemptsSQL, pruneDeliveriesSQL} {
			tag, err := tx.Exec(ctx, sql, retention, batch)
			if err != nil {
				return err
			}
			deleted += tag.RowsAffected()
			more = more || tag.RowsAffected() == int64(batch)
		}
		return nil
	})
	if err != nil {
		return 0, false, asUnavailable(fmt.Errorf("prune the webhook record: %w", err))
	}
	return deleted, more, nil
}
