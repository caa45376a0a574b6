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

// The record of attempts (Deliveries.RecordAttempts): each attempt, the
// settling of its delivery, and what it says of its endpoint, many to a
// transaction.

const (
	// lockHealthSQL locks the endpoints whose health a record changes, in
	// the order of their key, before any of their deliveries: the order in
	// which a deletion, an update and another replica's record lock them
	// too, so that none waits for another in a circle. A claim skips them
	// meanwhile (lockDueEndpointsSQL).
	lockHealthSQL = `
SELECT FROM webhook_endpoints
WHERE (merchant_id, id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
ORDER BY merchant_id, id
FOR NO KEY UPDATE`

	insertAttemptsSQL = `
INSERT INTO webhook_attempts (merchant_id, endpoint_id, id, event_id, attempted_at, status, error, latency_ms)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::timestamptz[], $6::int[], $7::text[], $8::int[])
ON CONFLICT DO NOTHING`

	// settleSQL settles each delivery whose claim ($4) still holds it: a
	// 2xx ($6) delivers it; a failure schedules the next attempt $7
	// milliseconds from now, or abandons it once the attempt ($5) comes the
	// retry period ($8 milliseconds) or more after the first. It returns
	// the state of each it settled.
	settleSQL = `
UPDATE webhook_deliveries w SET
    attempts = w.attempts + 1,
    first_attempt_at = coalesce(w.first_attempt_at, a.at),
    state = CASE
        WHEN a.delivered THEN 'delivered'
        WHEN a.at - coalesce(w.first_attempt_at, a.at) >= a.retry_for * interval '1 millisecond' THEN 'abandoned'
        ELSE 'pending' END,
    next_attempt_at = CASE WHEN a.delivered THEN w.next_attempt_at ELSE now() + a.retry_in * interval '1 millisecond' END,
    lease_until = NULL,
    claim = NULL
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::timestamptz[], $6::bool[], $7::bigint[], $8::bigint[])
    AS a(merchant_id, endpoint_id, event_id, claim, at, delivered, retry_in, retry_for)
WHERE w.merchant_id = a.merchant_id AND w.endpoint_id = a.endpoint_id AND w.event_id = a.event_id
  AND w.claim = a.claim AND w.state = 'pending'
RETURNING w.merchant_id, w.endpoint_id, w.event_id, w.state`

	// healthSQL writes what the attempts taught of each endpoint: a 2xx
	// ends its run of failures and its pause, and grows its in-flight limit
	// by one per 2xx up to $6 when none failed; failures ($4) without a
	// 2xx lengthen the run and pause it $5 milliseconds; any failure halves
	// the limit. A row that would not change is not written.
	healthSQL = `
UPDATE webhook_endpoints e SET
    failures = CASE WHEN h.delivered > 0 THEN 0 ELSE e.failures + h.failed END,
    paused_until = CASE WHEN h.delivered > 0 THEN NULL ELSE now() + h.pause * interval '1 millisecond' END,
    in_flight_limit = CASE WHEN h.failed > 0 THEN greatest(e.in_flight_limit / 2, 1)
                           ELSE greatest(e.in_flight_limit, least(e.in_flight_limit + h.delivered, h.up_to)) END
FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::bigint[], $6::int[])
    AS h(merchant_id, endpoint_id, delivered, failed, pause, up_to)
WHERE e.merchant_id = h.merchant_id AND e.id = h.endpoint_id
  AND (h.failed > 0 OR e.failures > 0 OR e.paused_until IS NOT NULL OR e.in_flight_limit < h.up_to)`

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

// RecordAttempt records one attempt: RecordAttempts of one.
func (s *Deliveries) RecordAttempt(ctx context.Context, d payment.WebhookDelivery, a payment.WebhookAttempt) (string, error) {
	states, err := s.RecordAttempts(ctx, []payment.WebhookOutcome{{Delivery: d, Attempt: a}})
	if err != nil {
		return "", err
	}
	return states[0], nil
}

// RecordAttempts records attempts of claimed deliveries and, in the same
// transaction, settles each delivery its claim still holds: delivered on a
// 2xx; otherwise due again Attempt.RetryIn from now, or, once its attempts
// have failed for Attempt.RetryFor since the first, abandoned with its
// endpoint disabled. It writes what the attempts say of their endpoints'
// health (healthSQL). It returns each delivery's state after it, in the
// order given (a payment.Delivery* constant), or "" where the claim no
// longer held it (its lease expired and another claim took it, or it was
// settled meanwhile): the attempt is recorded then too, and the delivery
// left to the claim that holds it. An attempt recorded again under its ID
// (after a commit whose answer was lost) is recorded once, and settles
// nothing more: its claim no longer holds the delivery. An attempt without
// an ID is given one. A deadlock is tried again; the error wraps
// payment.ErrUnavailable when the database fails.
func (s *Deliveries) RecordAttempts(ctx context.Context, outcomes []payment.WebhookOutcome) ([]string, error) {
	b := newAttemptBatch(outcomes)
	var (
		states []string
		events int // webhook_endpoint.disabled events written
	)
	run := func(tx pgx.Tx) error {
		states, events = make([]string, len(outcomes)), 0
		return b.record(ctx, tx, states, &events)
	}
	if err := s.inTxRetried(ctx, run); err != nil {
		return nil, asUnavailable(fmt.Errorf("record webhook attempts: %w", err))
	}
	if events > 0 {
		s.eventsCommitted()
	}
	return states, nil
}

// attemptBatch is RecordAttempts' statements' arguments, column by column;
// the ids as pgtype.UUID, which pgx sends as they are (a uuid.UUID goes
// through its driver.Valuer, a string: most of the CPU the recorder spent
// in pgx under the bench's load).
type attemptBatch struct {
	merchants, endpoints, ids, eventIDs, claims []pgtype.UUID
	at                                          []time.Time
	status                                      []pgtype.Int4
	errText                                     []pgtype.Text
	latency                                     []int32
	delivered                                   []bool
	retryIn, retryFor                           []int64
	health                                      endpointHealth
	index                                       map[[3]pgtype.UUID]int // a delivery's place in outcomes
}

// endpointHealth is healthSQL's arguments: per endpoint whose health the
// batch changes, its 2xx and failures, the longest pause and the bound.
type endpointHealth struct {
	merchants, endpoints []pgtype.UUID
	delivered, failed    []int32
	pause                []int64
	upTo                 []int32
}

func newAttemptBatch(outcomes []payment.WebhookOutcome) *attemptBatch {
	b := &attemptBatch{index: make(map[[3]pgtype.UUID]int, len(outcomes))}
	at := map[[2]pgtype.UUID]int{} // an endpoint's place in b.health
	for i, o := range outcomes {
		d, a := o.Delivery, o.Attempt
		if a.ID == uuid.Nil {
			a.ID = payment.NewID()
		}
		code, errText := attemptResult(a)
		merchant, endpoint, eventID := pgUUID(d.MerchantID), pgUUID(d.EndpointID), pgUUID(d.EventID)
		b.merchants = append(b.merchants, merchant)
		b.endpoints = append(b.endpoints, endpoint)
		b.ids = append(b.ids, pgUUID(a.ID))
		b.eventIDs = append(b.eventIDs, eventID)
		b.claims = append(b.claims, pgUUID(d.Claim))
		b.at = append(b.at, a.At)
		b.status = append(b.status, pgtype.Int4{Int32: int32(deref(code)), Valid: code != nil})
		b.errText = append(b.errText, pgtype.Text{String: deref(errText), Valid: errText != nil})
		b.latency = append(b.latency, int32(min(a.Latency.Milliseconds(), 1<<31-1)))
		b.delivered = append(b.delivered, a.Delivered())
		b.retryIn = append(b.retryIn, a.RetryIn.Milliseconds())
		b.retryFor = append(b.retryFor, a.RetryFor.Milliseconds())
		b.index[[3]pgtype.UUID{merchant, endpoint, eventID}] = i

		// A 2xx of a healthy endpoint at its bound changes nothing.
		if a.Delivered() && d.EndpointFailures == 0 && d.EndpointInFlight >= a.InFlightUpTo {
			continue
		}
		key := [2]pgtype.UUID{merchant, endpoint}
		j, ok := at[key]
		if !ok {
			j = len(b.health.endpoints)
			at[key] = j
			h := &b.health
			h.merchants, h.endpoints = append(h.merchants, merchant), append(h.endpoints, endpoint)
			h.delivered, h.failed = append(h.delivered, 0), append(h.failed, 0)
			h.pause, h.upTo = append(h.pause, 0), append(h.upTo, int32(max(a.InFlightUpTo, 1)))
		}
		if a.Delivered() {
			b.health.delivered[j]++
		} else {
			b.health.failed[j]++
			b.health.pause[j] = max(b.health.pause[j], a.PauseFor.Milliseconds())
		}
	}
	return b
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// record runs the batch's statements on tx, writing each delivery's state
// into states and counting the events it writes.
func (b *attemptBatch) record(ctx context.Context, tx pgx.Tx, states []string, events *int) error {
	h := &b.health
	if len(h.endpoints) > 0 {
		if _, err := tx.Exec(ctx, lockHealthSQL, h.merchants, h.endpoints); err != nil {
			return fmt.Errorf("lock endpoints: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, insertAttemptsSQL, b.merchants, b.endpoints, b.ids, b.eventIDs,
		b.at, b.status, b.errText, b.latency); err != nil {
		return fmt.Errorf("insert attempts: %w", err)
	}
	rows, _ := tx.Query(ctx, settleSQL, b.merchants, b.endpoints, b.eventIDs, b.claims,
		b.at, b.delivered, b.retryIn, b.retryFor)
	var abandoned [][2]pgtype.UUID
	for rows.Next() {
		var (
			key   [3]pgtype.UUID
			state string
		)
		if err := rows.Scan(&key[0], &key[1], &key[2], &state); err != nil {
			rows.Close()
			return err
		}
		states[b.index[key]] = state
		if state == payment.DeliveryAbandoned {
			abandoned = append(abandoned, [2]pgtype.UUID{key[0], key[1]})
		}
	}
	if rows.Close(); rows.Err() != nil {
		return fmt.Errorf("settle deliveries: %w", rows.Err())
	}
	if len(h.endpoints) > 0 {
		if _, err := tx.Exec(ctx, healthSQL, h.merchants, h.endpoints, h.delivered, h.failed, h.pause, h.upTo); err != nil {
			return fmt.Errorf("write endpoint health: %w", err)
		}
	}
	for _, e := range abandoned {
		if err := disableEndpoint(ctx, tx, e[0].Bytes, e[1].Bytes, events); err != nil {
			return err
		}
	}
	return nil
}
