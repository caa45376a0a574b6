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
		var e payment.Event
		if err := row.Scan(&d.MerchantID, &d.EndpointID, &d.EventID, &d.Attempt, &d.URL, &d.Secret,
			&d.EndpointFailures, &d.EndpointInFlight, &e.Type, &e.Data, &e.CreatedAt); err != nil {
			return d, err
		}
		e.ID = d.EventID
		body, err := json.Marshal(e)
		d.Body = body
		return d, err
	}
}

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
	err := s.inTx(ctx, run)
	for attempt := 2; retryable(err) && attempt <= maxAttempts; attempt++ {
		err = s.inTx(ctx, run)
	}
	if err != nil {
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
