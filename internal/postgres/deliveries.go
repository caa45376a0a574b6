package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/payments/internal/payment"
)

// Deliveries keeps the state of webhook deliveries (migration 0013,
// docs/webhooks.md): the fan-out of events to endpoints, the workers'
// leased claims, and the record of attempts. It decides no backoff and sends
// nothing: internal/webhook's Deliverer does, through the port it declares.
type Deliveries struct {
	*db
	pending pendingPass // where pruning got to in the pending ones (webhookprune.go)
}

// NewDeliveries builds the Deliveries role on d.
func NewDeliveries(d *DB) *Deliveries { return &Deliveries{db: d.db} }

// WatchEvents returns a channel that receives soon after this process
// commits events, and a func that ends the watch: the Deliverer fans out
// when it receives.
func (s *Deliveries) WatchEvents() (<-chan struct{}, func()) { return s.watchEvents() }

const (
	// claimUnderFanOutSQL takes the fan-out's lock shared until the claim
	// ends: a claim waits for a fan-out that leases (FanOutAndLease), and a
	// fan-out finds the lock taken while claims run (and tries again soon),
	// so each counts the leases of the other as committed.
	claimUnderFanOutSQL = `SELECT pg_advisory_xact_lock_shared($1)`

	// lockDueEndpointsSQL locks the live enabled endpoints that have a due
	// delivery and are not paused after a failure, skipping those another
	// claim holds: two claims never count and lease one endpoint's
	// deliveries at once, so neither passes its bounds. It returns each with
	// how many of its deliveries may be in flight: one, a probe, while its
	// last attempts failed; else its in_flight_limit, at most $1.
	//
	// It finds the endpoints with a pending delivery by a skip scan of
	// webhook_deliveries_due (the recursive part: one index probe per such
	// endpoint), so idle endpoints, however many, cost nothing; then one due
	// delivery per endpoint (a LATERAL with a LIMIT: written as EXISTS, the
	// planner chose a semi-join that read every pending delivery, 44 ms with
	// a backlog of 50,000).
	lockDueEndpointsSQL = `
WITH RECURSIVE pending AS (
    (SELECT merchant_id, endpoint_id FROM webhook_deliveries
     WHERE state = 'pending' ORDER BY merchant_id, endpoint_id LIMIT 1)
    UNION ALL
    SELECT next.merchant_id, next.endpoint_id FROM pending p
    CROSS JOIN LATERAL (
        SELECT merchant_id, endpoint_id FROM webhook_deliveries
        WHERE state = 'pending' AND (merchant_id, endpoint_id) > (p.merchant_id, p.endpoint_id)
        ORDER BY merchant_id, endpoint_id LIMIT 1
    ) next
)
SELECT e.merchant_id, e.id, CASE WHEN e.failures > 0 THEN 1 ELSE least(e.in_flight_limit, $1) END
FROM pending p
JOIN webhook_endpoints e ON e.merchant_id = p.merchant_id AND e.id = p.endpoint_id
CROSS JOIN LATERAL (
    SELECT FROM webhook_deliveries d
    WHERE d.merchant_id = e.merchant_id AND d.endpoint_id = e.id AND d.state = 'pending'
      AND d.next_attempt_at <= now() AND (d.lease_until IS NULL OR d.lease_until <= now())
    ORDER BY d.next_attempt_at
    LIMIT 1
) due
WHERE e.deleted_at IS NULL AND e.status = 'enabled'
  AND (e.paused_until IS NULL OR e.paused_until <= now())
FOR NO KEY UPDATE OF e SKIP LOCKED`

	// claimSQL, a statement of its own after lockDueEndpointsSQL (so its
	// snapshot sees every lease committed before those locks), leases due
	// deliveries of the locked endpoints ($1, $2), the earliest due first:
	// per endpoint up to its bound ($3) less those it has leased and
	// unexpired, per merchant up to $4 less those leased, and $5 in all,
	// taken in turns across merchants (each merchant's first, then each
	// one's second, ...), so that a merchant with a backlog fills no claim
	// while another has a delivery due. It returns each with its endpoint
	// and its event. The leased counts read webhook_deliveries_leased
	// (migration 0014): leased rows are the few in flight.
	claimSQL = `
WITH ep AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[]) AS e(merchant_id, id, bound)
), merchant_room AS MATERIALIZED (
    SELECT m.merchant_id, greatest($4 - (
        SELECT count(*) FROM webhook_deliveries y
        WHERE y.merchant_id = m.merchant_id AND y.state = 'pending'
          AND y.lease_until IS NOT NULL AND y.lease_until > now()), 0) AS room
    FROM (SELECT DISTINCT merchant_id FROM ep) m
), due AS (
    SELECT d.merchant_id, d.endpoint_id, d.event_id, d.next_attempt_at,
           row_number() OVER (PARTITION BY d.merchant_id ORDER BY d.next_attempt_at) AS turn
    FROM ep e
    CROSS JOIN LATERAL (
        SELECT x.merchant_id, x.endpoint_id, x.event_id, x.next_attempt_at FROM webhook_deliveries x
        WHERE x.merchant_id = e.merchant_id AND x.endpoint_id = e.id AND x.state = 'pending'
          AND x.next_attempt_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
        ORDER BY x.next_attempt_at
        LIMIT greatest(e.bound - (
            SELECT count(*) FROM webhook_deliveries y
            WHERE y.merchant_id = e.merchant_id AND y.endpoint_id = e.id AND y.state = 'pending'
              AND y.lease_until IS NOT NULL AND y.lease_until > now()), 0)
        FOR UPDATE SKIP LOCKED
    ) d
), fair AS (
    SELECT due.merchant_id, due.endpoint_id, due.event_id
    FROM due JOIN merchant_room m ON m.merchant_id = due.merchant_id
    WHERE due.turn <= m.room
    ORDER BY due.turn, due.next_attempt_at
    LIMIT $5
), leased AS (
    UPDATE webhook_deliveries w SET lease_until = now() + $6::interval, claim = $7
    FROM fair
    WHERE (w.merchant_id, w.endpoint_id, w.event_id) = (fair.merchant_id, fair.endpoint_id, fair.event_id)
    RETURNING w.merchant_id, w.endpoint_id, w.event_id, w.attempts
)
SELECT l.merchant_id, l.endpoint_id, l.event_id, l.attempts + 1, e.url, e.secret, e.failures, least(e.in_flight_limit, $8),
       ev.type, ev.payload, ev.created_at
FROM leased l
JOIN webhook_endpoints e ON e.merchant_id = l.merchant_id AND e.id = l.endpoint_id
JOIN events ev ON ev.merchant_id = l.merchant_id AND ev.id = l.event_id`
)

// ClaimDeliveries leases up to total due deliveries (pending, next attempt
// due, no unexpired lease) of live enabled endpoints that are not paused,
// for lease: per endpoint at most its bound (one while its attempts fail,
// else its in-flight limit up to perEndpoint), per merchant at most
// perMerchant, counting those already leased, taken in turns across
// merchants. It returns each with its endpoint's URL, secret, failures and
// bound, its event as /v1/events shows it, and its attempt number. The
// lease is committed before it returns; only this claim may settle the
// deliveries (RecordAttempts). It returns an error wrapping
// payment.ErrUnavailable when the database fails.
func (s *Deliveries) ClaimDeliveries(ctx context.Context, perEndpoint, perMerchant, total int, lease time.Duration) ([]payment.WebhookDelivery, error) {
	var claimed []payment.WebhookDelivery
	claim := payment.NewID()
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, claimUnderFanOutSQL, int64(fanOutLockKey)); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, lockDueEndpointsSQL, perEndpoint)
		var (
			merchants, endpoints []pgtype.UUID
			bounds               []int32
		)
		for rows.Next() {
			var (
				m, e  pgtype.UUID
				bound int32
			)
			if err := rows.Scan(&m, &e, &bound); err != nil {
				rows.Close()
				return err
			}
			merchants, endpoints, bounds = append(merchants, m), append(endpoints, e), append(bounds, bound)
		}
		if rows.Close(); rows.Err() != nil || len(endpoints) == 0 {
			return rows.Err()
		}
		rows, _ = tx.Query(ctx, claimSQL, merchants, endpoints, bounds, perMerchant, total, lease, claim, perEndpoint)
		var err error
		claimed, err = pgx.CollectRows(rows, scanDelivery(claim))
		return err
	})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("claim webhook deliveries: %w", err))
	}
	return claimed, nil
}

// scanDelivery scans a row of claimSQL or leasedSQL, leased under claim:
// the delivery with its endpoint, its health and its event, which it
// marshals as /v1/events shows it.
func scanDelivery(claim uuid.UUID) pgx.RowToFunc[payment.WebhookDelivery] {
	return func(row pgx.CollectableRow) (payment.WebhookDelivery, error) {
		d := payment.WebhookDelivery{Claim: claim}
		var (
			e       payment.Event
			payload []byte // as stored: scanned into a json.RawMessage, it is parsed once more
		)
		if err := row.Scan(&d.MerchantID, &d.EndpointID, &d.EventID, &d.Attempt, &d.URL, &d.Secret,
			&d.EndpointFailures, &d.EndpointInFlight, &e.Type, &payload, &e.CreatedAt); err != nil {
			return d, err
		}
		e.ID, e.Data, d.EventCreatedAt = d.EventID, payload, e.CreatedAt
		body, err := json.Marshal(e)
		d.Body = body
		return d, err
	}
}

// disableEndpoint disables the endpoint, abandoning its pending
// deliveries, and, if this disabled it, writes the
// webhook_endpoint.disabled event (its data the endpoint as GET shows it) on
// tx, counting it in events.
func disableEndpoint(ctx context.Context, tx pgx.Tx, merchantID, endpointID uuid.UUID, events *int) error {
	rows, _ := tx.Query(ctx, disableEndpointSQL, merchantID, endpointID)
	disabled, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil || len(disabled) == 0 {
		return err
	}
	l := &ledger{q: tx}
	if err := l.event(ctx, merchantID, "webhook_endpoint", endpointID, payment.EventWebhookEndpointDisabled, disabled[0]); err != nil {
		return err
	}
	*events += l.events
	return nil
}

// attemptResult is the attempt's status or its error, the one column of the
// two that webhook_attempts allows: a status outside 100-599 (which Go's
// client accepts from a server) is recorded as the error it is.
func attemptResult(a payment.WebhookAttempt) (status *int, errText *string) {
	msg := a.Error
	switch {
	case msg != "":
	case a.Status >= 100 && a.Status <= 599:
		return &a.Status, nil
	case a.Status != 0:
		msg = fmt.Sprintf("answered with the invalid status %d", a.Status)
	default:
		msg = "no answer"
	}
	msg = truncate(msg, 1024)
	return nil, &msg
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
