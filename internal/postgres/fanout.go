package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
)

// fanOutLockKey is the advisory lock that lets one fan-out run at a time.
const fanOutLockKey = 0x7061796d_7768666f // "paymwhfo"

// A round of the fan-out, and why it reads no idle endpoint (migration 0022).
// It reads the first fanOutScan events after the fan-out's position and below
// the event horizon (read by the statement before: horizon.go), in feed
// order, and fans out to the live enabled endpoints of the merchants it found
// there, and to those flagged behind; then it moves the position to the last
// event it read. The invariant that lets it pass over the other endpoints:
//
//	every live enabled endpoint not flagged behind has fanned out all its
//	merchant's events up to the position.
//
// An endpoint is created behind, and enabling one flags it (migration 0022's
// trigger): a round running meanwhile neither sees it nor waits for it, and
// may move the position over its first events. A round fans an endpoint out
// from its cursor as the feed pages, up to a batch of its merchant's events
// below the horizon, and leaves it behind if the batch was full: one read
// short of a batch has fanned out every such event, those up to the new
// position included. When no endpoint is caught up, the invariant asks
// nothing of the position, and the round moves it to the horizon: so the
// rounds after a time without endpoints (or after the upgrade) skip, rather
// than read, the events written meanwhile.

// fanOutScan bounds the events a round reads after the position.
const fanOutScan = 1000

// fanOutSQL is a round, in one statement, so the deliveries, the cursors,
// the flags and the position commit together: a crash repeats nothing and
// skips nothing. An endpoint is written only when its cursor moves or its
// flag changes. It leases those of the deliveries it creates that fit the
// caller's bounds (room, merchant_room: the leased counts, read once per
// endpoint and per merchant; to_lease: each endpoint's earliest events, in
// turns across merchants) to the caller's claim. It returns how many
// deliveries it created, how many it leased, and whether to run again soon: the scan was full (and the position did not jump), an
// endpoint is still behind, or committed events of a merchant with a live
// endpoint wait at or above the horizon (the first 1000 in feed order at
// most, the events committed since the oldest transaction still running
// began, read along events_order: the ORDER BY and LIMIT keep the planner on
// it; without them, its generic plan for tx_id >= @horizon read the whole
// table).
const fanOutSQL = `
WITH scanned AS (
    SELECT ev.merchant_id, ev.tx_id, ev.seq
    FROM webhook_fanout_position p
    CROSS JOIN LATERAL (
        SELECT merchant_id, tx_id, seq FROM events
        WHERE (tx_id, seq) > (p.tx_id, p.seq) AND tx_id < @horizon::xid8
        ORDER BY tx_id, seq
        LIMIT @scan
    ) ev
), due AS (
    SELECT merchant_id, id, events, cursor_tx, cursor_seq, behind FROM webhook_endpoints
    WHERE merchant_id IN (SELECT merchant_id FROM scanned)
      AND NOT behind AND deleted_at IS NULL AND status = 'enabled'
    UNION ALL
    SELECT merchant_id, id, events, cursor_tx, cursor_seq, behind FROM webhook_endpoints
    WHERE behind AND deleted_at IS NULL AND status = 'enabled'
), batch AS (
    SELECT e.merchant_id, e.id AS endpoint_id, e.events AS subscribed, ev.id AS event_id, ev.type, ev.tx_id, ev.seq
    FROM due e
    CROSS JOIN LATERAL (
        SELECT id, type, tx_id, seq FROM events
        WHERE merchant_id = e.merchant_id
          AND tx_id < @horizon::xid8
          AND (tx_id, seq) > (e.cursor_tx, e.cursor_seq)
        ORDER BY tx_id, seq
        LIMIT @batch
    ) ev
), wanted AS (
    SELECT merchant_id, endpoint_id, event_id, tx_id, seq FROM batch
    WHERE '*' = ANY (subscribed) OR type = ANY (subscribed)
), room AS MATERIALIZED (
    SELECT e.merchant_id, e.id AS endpoint_id, greatest(least(e.in_flight_limit, @per_endpoint) - (
        SELECT count(*) FROM webhook_deliveries y
        WHERE y.merchant_id = e.merchant_id AND y.endpoint_id = e.id AND y.state = 'pending'
          AND y.lease_until IS NOT NULL AND y.lease_until > now()), 0) AS room
    FROM webhook_endpoints e
    WHERE @total > 0 AND (e.merchant_id, e.id) IN (SELECT merchant_id, endpoint_id FROM wanted)
      AND e.failures = 0 AND (e.paused_until IS NULL OR e.paused_until <= now())
), merchant_room AS MATERIALIZED (
    SELECT m.merchant_id, greatest(@per_merchant - (
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
    LIMIT @total
), inserted AS (
    INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, lease_until, claim)
    SELECT w.merchant_id, w.endpoint_id, w.event_id,
           CASE WHEN l.event_id IS NOT NULL THEN now() + @lease::interval END,
           CASE WHEN l.event_id IS NOT NULL THEN @claim::uuid END
    FROM wanted w
    LEFT JOIN to_lease l ON (l.merchant_id, l.endpoint_id, l.event_id) = (w.merchant_id, w.endpoint_id, w.event_id)
    ON CONFLICT DO NOTHING
    RETURNING claim IS NOT NULL AS leased
), last AS (
    SELECT DISTINCT ON (merchant_id, endpoint_id) merchant_id, endpoint_id, tx_id, seq,
           count(*) OVER (PARTITION BY merchant_id, endpoint_id) = @batch AS full_batch
    FROM batch ORDER BY merchant_id, endpoint_id, tx_id DESC, seq DESC
), moved AS (
    UPDATE webhook_endpoints e
    SET cursor_tx = coalesce(last.tx_id, e.cursor_tx), cursor_seq = coalesce(last.seq, e.cursor_seq),
        behind = coalesce(last.full_batch, false)
    FROM due LEFT JOIN last ON last.merchant_id = due.merchant_id AND last.endpoint_id = due.id
    WHERE e.merchant_id = due.merchant_id AND e.id = due.id
      AND (last.endpoint_id IS NOT NULL OR due.behind)
    RETURNING e.behind
), jump AS (
    SELECT NOT EXISTS (
        SELECT FROM webhook_endpoints WHERE NOT behind AND deleted_at IS NULL AND status = 'enabled') AS yes
), target AS (
    SELECT tx_id, seq FROM (
        (SELECT tx_id, seq FROM scanned ORDER BY tx_id DESC, seq DESC LIMIT 1)
        UNION ALL
        SELECT @horizon::xid8, 0 FROM jump WHERE yes
    ) t
    ORDER BY tx_id DESC, seq DESC LIMIT 1
), advanced AS (
    UPDATE webhook_fanout_position p SET tx_id = target.tx_id, seq = target.seq
    FROM target WHERE (target.tx_id, target.seq) > (p.tx_id, p.seq)
)
SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM inserted WHERE leased),
    ((SELECT count(*) FROM scanned) = @scan AND NOT (SELECT yes FROM jump)) OR EXISTS (SELECT FROM moved WHERE behind) OR EXISTS (
        SELECT FROM (
            SELECT merchant_id FROM events
            WHERE tx_id >= @horizon::xid8
            ORDER BY tx_id, seq
            LIMIT 1000
        ) ev
        WHERE EXISTS (SELECT FROM webhook_endpoints e
                      WHERE e.merchant_id = ev.merchant_id AND e.deleted_at IS NULL AND e.status = 'enabled'))`

// fanOutPlanSQL keeps the planner, for the rest of the transaction, to the
// plan fanOutSQL is written for, as planSQL does the charge path's: index
// lookups of the endpoints and events a round touches, few as a rule. From a
// scan of up to fanOutScan events it guesses thousands, and chose to hash the
// whole endpoints table three times a round; the cost it then saw turned JIT
// compilation on, 0.8 s a round with 16,000 endpoints. One generic plan per
// connection serves every round.
const fanOutPlanSQL = `
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true)`

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
// FanOut runs a round of the fan-out in one transaction: each live enabled
// endpoint whose merchant wrote events since the last round, or that is
// behind, has its cursor moved over up to batch of its merchant's next
// events, and a pending delivery inserted of each event it subscribes to.
// One fan-out runs at a time across replicas; another finds the lock taken
// and returns at once, with Again set (the running one may have begun before
// the caller's events committed). With no live enabled endpoint it reads
// nothing more and says so (Idle). It returns what it did, or an error
// wrapping payment.ErrUnavailable.
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
// Claims run under the fan-out's lock shared (claimUnderFanOutSQL), so
// none leases meanwhile and the bounds hold.
func (s *Deliveries) FanOutAndLease(ctx context.Context, batch int, lease payment.FanOutLease) (payment.FanOut, []payment.WebhookDelivery, error) {
	var (
		r      payment.FanOut
		leased []payment.WebhookDelivery
	)
	claim := payment.NewID()
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		r, leased = payment.FanOut{}, nil
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
		if _, err := tx.Exec(ctx, fanOutPlanSQL); err != nil {
			return err
		}
		args := pgx.NamedArgs{"horizon": h.xid, "batch": batch, "scan": fanOutScan,
			"per_endpoint": lease.PerEndpoint, "per_merchant": lease.PerMerchant, "total": max(lease.Total, 0),
			"lease": lease.For, "claim": claim}
		if err := tx.QueryRow(ctx, fanOutSQL, args).Scan(&r.Created, &r.Leased, &r.Again); err != nil || r.Leased == 0 {
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
