package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
)

// fanOutLockKey is the advisory lock that lets one fan-out run at a time.
const fanOutLockKey = 0x7061796d_7768666f // "paymwhfo"

// fanOutSQL reads, for every live enabled endpoint, up to $2 of its
// merchant's events after its cursor and below the event horizon ($1, read by
// the statement before: horizon.go), exactly as the feed pages; inserts a
// delivery of each that the endpoint subscribes to; and moves the cursor to
// the last event read, subscribed to or not. All in one statement, so the
// deliveries and the cursor commit together: a crash repeats nothing and
// skips nothing. It returns how many deliveries it created, and whether
// committed events of a merchant with a live endpoint wait at or above the
// horizon: the first 1000 in feed order at most, the events committed since
// the oldest transaction still running began, read along events_order (the
// ORDER BY and LIMIT keep the planner on it: without them, its generic plan
// for tx_id >= $1 read the whole table).
const fanOutSQL = `
WITH batch AS (
    SELECT e.merchant_id, e.id AS endpoint_id, e.events AS subscribed, ev.id AS event_id, ev.type, ev.tx_id, ev.seq
    FROM webhook_endpoints e
    CROSS JOIN LATERAL (
        SELECT id, type, tx_id, seq FROM events
        WHERE merchant_id = e.merchant_id
          AND tx_id < $1::xid8
          AND (tx_id, seq) > (e.cursor_tx, e.cursor_seq)
        ORDER BY tx_id, seq
        LIMIT $2
    ) ev
    WHERE e.deleted_at IS NULL AND e.status = 'enabled'
), inserted AS (
    INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id)
    SELECT merchant_id, endpoint_id, event_id FROM batch
    WHERE '*' = ANY (subscribed) OR type = ANY (subscribed)
    ON CONFLICT DO NOTHING
    RETURNING 1
), moved AS (
    UPDATE webhook_endpoints e SET cursor_tx = last.tx_id, cursor_seq = last.seq
    FROM (
        SELECT DISTINCT ON (merchant_id, endpoint_id) merchant_id, endpoint_id, tx_id, seq
        FROM batch ORDER BY merchant_id, endpoint_id, tx_id DESC, seq DESC
    ) last
    WHERE e.merchant_id = last.merchant_id AND e.id = last.endpoint_id
)
SELECT (SELECT count(*) FROM inserted), EXISTS (
    SELECT FROM (
        SELECT merchant_id FROM events
        WHERE tx_id >= $1::xid8
        ORDER BY tx_id, seq
        LIMIT 1000
    ) ev
    WHERE EXISTS (SELECT FROM webhook_endpoints e
                  WHERE e.merchant_id = ev.merchant_id AND e.deleted_at IS NULL AND e.status = 'enabled'))`

// fanOutLockSQL takes the fan-out's lock, and says whether there is any live
// enabled endpoint: without one a fan-out has nothing to do, and skips the
// event horizon's reading.
const fanOutLockSQL = `SELECT pg_try_advisory_xact_lock($1), EXISTS (
    SELECT FROM webhook_endpoints WHERE deleted_at IS NULL AND status = 'enabled')`

// FanOut moves every live enabled endpoint's cursor over up to batch of its
// merchant's next events, inserting a pending delivery of each event the
// endpoint subscribes to, in one transaction. One fan-out runs at a time
// across replicas; another finds the lock taken and returns at once, with
// Again set (the running one may have begun before the caller's events
// committed). With no live enabled endpoint it reads nothing more and says
// so (Idle). It returns what it did, or an error wrapping
// payment.ErrUnavailable.
func (s *Deliveries) FanOut(ctx context.Context, batch int) (payment.FanOut, error) {
	var r payment.FanOut
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var leader, endpoints bool
		if err := tx.QueryRow(ctx, fanOutLockSQL, int64(fanOutLockKey)).Scan(&leader, &endpoints); err != nil || !leader || !endpoints {
			r.Again = err == nil && !leader
			r.Idle = err == nil && leader && !endpoints
			return err
		}
		h, err := eventHorizon(ctx, tx)
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, fanOutSQL, h.xid, batch).Scan(&r.Created, &r.Again)
	})
	if err != nil {
		return payment.FanOut{}, asUnavailable(fmt.Errorf("fan out events to webhook endpoints: %w", err))
	}
	return r, nil
}
