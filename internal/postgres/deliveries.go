package postgres

import (
	"context"
	"encoding/json"
	"errors"
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
	// lockDueEndpointsSQL locks the live enabled endpoints that have a due
	// delivery, skipping those another claim holds: two claims never count
	// and lease one endpoint's deliveries at once, so neither passes the
	// per-endpoint bound. It looks for one due delivery per endpoint in
	// webhook_deliveries_due (a LATERAL with a LIMIT: written as EXISTS,
	// the planner chose a semi-join that read every pending delivery, 44 ms
	// with a backlog of 50,000).
	lockDueEndpointsSQL = `
SELECT e.merchant_id, e.id FROM webhook_endpoints e
CROSS JOIN LATERAL (
    SELECT FROM webhook_deliveries d
    WHERE d.merchant_id = e.merchant_id AND d.endpoint_id = e.id AND d.state = 'pending'
      AND d.next_attempt_at <= now() AND (d.lease_until IS NULL OR d.lease_until <= now())
    ORDER BY d.next_attempt_at
    LIMIT 1
) due
WHERE e.deleted_at IS NULL AND e.status = 'enabled'
FOR NO KEY UPDATE OF e SKIP LOCKED`

	// claimSQL, a statement of its own after lockDueEndpointsSQL (so its
	// snapshot sees every lease committed before those locks), leases the
	// due deliveries of the locked endpoints ($1, $2), the earliest due
	// first: per endpoint up to $3 less those it has leased and unexpired,
	// and $4 in all. It returns each with its endpoint and its event.
	claimSQL = `
WITH due AS (
    SELECT d.merchant_id, d.endpoint_id, d.event_id
    FROM unnest($1::uuid[], $2::uuid[]) AS e(merchant_id, id)
    CROSS JOIN LATERAL (
        SELECT x.merchant_id, x.endpoint_id, x.event_id, x.next_attempt_at FROM webhook_deliveries x
        WHERE x.merchant_id = e.merchant_id AND x.endpoint_id = e.id AND x.state = 'pending'
          AND x.next_attempt_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
        ORDER BY x.next_attempt_at
        LIMIT greatest($3 - (
            SELECT count(*) FROM webhook_deliveries y
            WHERE y.merchant_id = e.merchant_id AND y.endpoint_id = e.id AND y.state = 'pending'
              AND y.lease_until > now()), 0)
        FOR UPDATE SKIP LOCKED
    ) d
    ORDER BY d.next_attempt_at
    LIMIT $4
), leased AS (
    UPDATE webhook_deliveries w SET lease_until = now() + $5::interval, claim = $6
    FROM due
    WHERE (w.merchant_id, w.endpoint_id, w.event_id) = (due.merchant_id, due.endpoint_id, due.event_id)
    RETURNING w.merchant_id, w.endpoint_id, w.event_id, w.attempts
)
SELECT l.merchant_id, l.endpoint_id, l.event_id, l.attempts + 1, e.url, e.secret, ev.type, ev.payload, ev.created_at
FROM leased l
JOIN webhook_endpoints e ON e.merchant_id = l.merchant_id AND e.id = l.endpoint_id
JOIN events ev ON ev.merchant_id = l.merchant_id AND ev.id = l.event_id`
)

// ClaimDeliveries leases up to total due deliveries (pending, next attempt
// due, no unexpired lease) of live enabled endpoints for lease, at most
// perEndpoint per endpoint counting those already leased, and returns each
// with its endpoint's URL and secret, its event as /v1/events shows it, and
// its attempt number. The lease is committed before it returns; only this
// claim may settle the deliveries (RecordAttempt). It returns an error
// wrapping payment.ErrUnavailable when the database fails.
func (s *Deliveries) ClaimDeliveries(ctx context.Context, perEndpoint, total int, lease time.Duration) ([]payment.WebhookDelivery, error) {
	var claimed []payment.WebhookDelivery
	claim := payment.NewID()
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, lockDueEndpointsSQL)
		var merchants, endpoints []pgtype.UUID
		for rows.Next() {
			var m, e pgtype.UUID
			if err := rows.Scan(&m, &e); err != nil {
				rows.Close()
				return err
			}
			merchants, endpoints = append(merchants, m), append(endpoints, e)
		}
		if rows.Close(); rows.Err() != nil || len(endpoints) == 0 {
			return rows.Err()
		}
		rows, _ = tx.Query(ctx, claimSQL, merchants, endpoints, perEndpoint, total, lease, claim)
		var err error
		claimed, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.WebhookDelivery, error) {
			d := payment.WebhookDelivery{Claim: claim}
			var e payment.Event
			if err := row.Scan(&d.MerchantID, &d.EndpointID, &d.EventID, &d.Attempt, &d.URL, &d.Secret,
				&e.Type, &e.Data, &e.CreatedAt); err != nil {
				return d, err
			}
			e.ID = d.EventID
			body, err := json.Marshal(e)
			d.Body = body
			return d, err
		})
		return err
	})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("claim webhook deliveries: %w", err))
	}
	return claimed, nil
}

const (
	insertAttemptSQL = `
INSERT INTO webhook_attempts (merchant_id, endpoint_id, id, event_id, attempted_at, status, error, latency_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT DO NOTHING`

	// settleSQL settles the delivery if the claim $4 still holds it: a
	// 2xx ($6) delivers it; a failure schedules the next attempt $7 from
	// now, or abandons it once the attempt ($5) comes the retry period ($8)
	// or more after the first.
	settleSQL = `
UPDATE webhook_deliveries SET
    attempts = attempts + 1,
    first_attempt_at = coalesce(first_attempt_at, $5),
    state = CASE
        WHEN $6 THEN 'delivered'
        WHEN $5::timestamptz - coalesce(first_attempt_at, $5) >= $8::interval THEN 'abandoned'
        ELSE 'pending' END,
    next_attempt_at = CASE WHEN $6 THEN next_attempt_at ELSE now() + $7::interval END,
    lease_until = NULL,
    claim = NULL
WHERE merchant_id = $1 AND endpoint_id = $2 AND event_id = $3 AND claim = $4 AND state = 'pending'
RETURNING state`

	// disableEndpointSQL disables an endpoint whose delivery was abandoned,
	// and abandons its other pending deliveries: a disabled endpoint gets
	// nothing more, and pruning need not keep their events. It returns the
	// endpoint if this statement disabled it, and no row if it was
	// disabled already.
	disableEndpointSQL = `
WITH abandoned AS (
    UPDATE webhook_deliveries SET state = 'abandoned', lease_until = NULL, claim = NULL
    WHERE merchant_id = $1 AND endpoint_id = $2 AND state = 'pending'
)
UPDATE webhook_endpoints SET status = 'disabled'
WHERE merchant_id = $1 AND id = $2 AND status = 'enabled'
RETURNING ` + endpointColumns
)

// RecordAttempt records an attempt of a claimed delivery and, in the same
// transaction, settles the delivery if d's claim still holds it: delivered
// on a 2xx; otherwise due again a.RetryIn from now, or, once its attempts
// have failed for a.RetryFor since the first, abandoned with its endpoint
// disabled. It returns the delivery's state after it (a payment.Delivery*
// constant), or "" when the claim no longer held it (its lease expired and
// another claim took it, or it was settled meanwhile): the attempt is
// recorded then too, and the delivery left to the claim that holds it. An
// attempt recorded again under its ID (after a commit whose answer was lost)
// is recorded once, and settles nothing more: its claim no longer holds the
// delivery. An attempt without an ID is given one. The error wraps
// payment.ErrUnavailable when the database fails.
func (s *Deliveries) RecordAttempt(ctx context.Context, d payment.WebhookDelivery, a payment.WebhookAttempt) (string, error) {
	code, errText := attemptResult(a)
	if a.ID == uuid.Nil {
		a.ID = payment.NewID()
	}
	var (
		state  string
		events int // the webhook_endpoint.disabled event, when written
	)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertAttemptSQL, d.MerchantID, d.EndpointID, a.ID, d.EventID,
			a.At, code, errText, a.Latency.Milliseconds()); err != nil {
			return fmt.Errorf("insert attempt: %w", err)
		}
		err := tx.QueryRow(ctx, settleSQL, d.MerchantID, d.EndpointID, d.EventID, d.Claim,
			a.At, a.Delivered(), a.RetryIn, a.RetryFor).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			state = ""
			return nil
		}
		if err != nil || state != payment.DeliveryAbandoned {
			return err
		}
		return disableEndpoint(ctx, tx, d.MerchantID, d.EndpointID, &events)
	})
	if err != nil {
		return "", asUnavailable(fmt.Errorf("record webhook attempt: %w", err))
	}
	if events > 0 {
		s.eventsCommitted()
	}
	return state, nil
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
