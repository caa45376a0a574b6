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
), wanted AS (
    SELECT merchant_id, endpoint_id, event_id, tx_id, seq FROM batch
    WHERE '*' = ANY (subscribed) OR type = ANY (subscribed)
), room AS MATERIALIZED (
    SELECT e.merchant_id, e.id AS endpoint_id, greatest(least(e.in_flight_limit, $3) - (
        SELECT count(*) FROM webhook_deliveries y
        WHERE y.merchant_id = e.merchant_id AND y.endpoint_id = e.id AND y.state = 'pending'
          AND y.lease_until IS NOT NULL AND y.lease_until > now()), 0) AS room
    FROM webhook_endpoints e
    WHERE $5 > 0 AND (e.merchant_id, e.id) IN (SELECT merchant_id, endpoint_id FROM wanted)
      AND e.failures = 0 AND (e.paused_until IS NULL OR e.paused_until <= now())
), merchant_room AS MATERIALIZED (
    SELECT m.merchant_id, greatest($4 - (
        SELECT count(*) FROM webhook_deliveries y
        WHERE y.merchant_id = m.merchant_id AND y.state = 'pending'
          AND y.lease_until IS NOT NULL AND y.lease_until > now()), 0) AS room
    FROM (SELECT DISTINCT merchant_id FROM room) m
), in_room AS (
    SELECT w.merchant_id, w.endpoint_id, w.event_id, w.tx_id, w.seq,
           row_number() OVER (PARTITION BY w.merchant_id ORDER BY w.tx_id, w.seq, w.endpoint_id) AS turn
    FROM (SELECT *, row_number() OVER (PARTITION BY merchant_id, endpoint_id ORDER BY tx_id, seq) AS nth
          FROM wanted) w
    JOIN room r ON r.merchant_id = w.merchant_id AND r.endpoint_id = w.endpoint_id
    WHERE w.nth <= r.room
), to_lease AS (
    SELECT i.merchant_id, i.endpoint_id, i.event_id
    FROM in_room i JOIN merchant_room m ON m.merchant_id = i.merchant_id
    WHERE i.turn <= m.room
    ORDER BY i.turn, i.tx_id, i.seq
    LIMIT $5
), inserted AS (
    INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, lease_until, claim)
    SELECT w.merchant_id, w.endpoint_id, w.event_id,
           CASE WHEN l.event_id IS NOT NULL THEN now() + $6::interval END,
           CASE WHEN l.event_id IS NOT NULL THEN $7::uuid END
    FROM wanted w
    LEFT JOIN to_lease l ON (l.merchant_id, l.endpoint_id, l.event_id) = (w.merchant_id, w.endpoint_id, w.event_id)
    ON CONFLICT DO NOTHING
    RETURNING claim IS NOT NULL AS leased
), moved AS (
    UPDATE webhook_endpoints e SET cursor_tx = last.tx_id, cursor_seq = last.seq
    FROM (
        SELECT DISTINCT ON (merchant_id, endpoint_id) merchant_id, endpoint_id, tx_id, seq
        FROM batch ORDER BY merchant_id, endpoint_id, tx_id DESC, seq DESC
    ) last
    WHERE e.merchant_id = last.merchant_id AND e.id = last.endpoint_id
)
SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM inserted WHERE leased), EXISTS (
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

// leasedSQL reads the deliveries a fan-out leased under the claim $1 on
// its transaction, through webhook_deliveries_leased, as claimSQL returns
// them; $2 bounds the endpoints' in-flight limits as lockDueEndpointsSQL.
const leasedSQL = `
SELECT l.merchant_id, l.endpoint_id, l.event_id, l.attempts + 1, e.url, e.secret, e.failures, least(e.in_flight_limit, $2),
       ev.type, ev.payload, ev.created_at
FROM webhook_deliveries l
JOIN webhook_endpoints e ON e.merchant_id = l.merchant_id AND e.id = l.endpoint_id
JOIN events ev ON ev.merchant_id = l.merchant_id AND ev.id = l.event_id
WHERE l.claim = $1 AND l.state = 'pending' AND l.lease_until IS NOT NULL`

// FanOut moves every live enabled endpoint's cursor over up to batch of its
// merchant's next events, inserting a pending delivery of each event the
// endpoint subscribes to, in one transaction. One fan-out runs at a time
// across replicas; another finds the lock taken and returns at once, with
// Again set (the running one may have begun before the caller's events
// committed). With no live enabled endpoint it reads nothing more and says
// so (Idle). It returns what it did, or an error wrapping
// payment.ErrUnavailable.
func (s *Deliveries) FanOut(ctx context.Context, batch int) (payment.FanOut, error) {
	r, _, err := s.FanOutAndLease(ctx, batch, payment.FanOutLease{})
	return r, err
}

// FanOutAndLease fans out as FanOut does, and leases to the caller, for
// lease.For, as many of the deliveries it creates as lease allows (the
// earliest events first, in turns across merchants): per endpoint that is
// not failing nor paused up to its in-flight limit (at most
// lease.PerEndpoint), per merchant up to lease.PerMerchant, counting those
// leased already, and lease.Total in all. It returns them as
// ClaimDeliveries does: a delivery fresh from the fan-out costs no claim.
// Claims run under the fan-out's lock shared (lockDueEndpointsSQL), so
// none leases meanwhile and the bounds hold.
func (s *Deliveries) FanOutAndLease(ctx context.Context, batch int, lease payment.FanOutLease) (payment.FanOut, []payment.WebhookDelivery, error) {
	var (
		r      payment.FanOut
		leased []payment.WebhookDelivery
	)
	claim := payment.NewID()
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		leased = nil
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
		if err := tx.QueryRow(ctx, fanOutSQL, h.xid, batch, lease.PerEndpoint, lease.PerMerchant, max(lease.Total, 0),
			lease.For, claim).Scan(&r.Created, &r.Leased, &r.Again); err != nil || r.Leased == 0 {
			return err
		}
		rows, _ := tx.Query(ctx, leasedSQL, claim, lease.PerEndpoint)
		leased, err = pgx.CollectRows(rows, scanDelivery(claim))
		return err
	})
	if err != nil {
		return payment.FanOut{}, nil, asUnavailable(fmt.Errorf("fan out events to webhook endpoints: %w", err))
	}
	return r, leased, nil
}
