package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/payments/internal/payment"
)

// Webhooks stores merchants' webhook endpoints (migration 0012,
// docs/webhooks.md). It stores what it is given: the URL check and the
// events' validation are the callers', before they call it.
type Webhooks struct{ *db }

// NewWebhooks builds the Webhooks role on d.
func NewWebhooks(d *DB) *Webhooks { return &Webhooks{d.db} }

const (
	// lockMerchantSQL serializes a merchant's endpoint creations, so the
	// count that follows cannot be raced past the limit.
	lockMerchantSQL = `SELECT FROM merchants WHERE id = $1 FOR UPDATE`

	countLiveEndpointsSQL = `SELECT count(*) FROM webhook_endpoints WHERE merchant_id = $1 AND deleted_at IS NULL`

	// insertEndpointSQL starts the endpoint's cursor at the event horizon
	// (horizon.go): it receives the events from its creation on. It starts
	// behind (the column's default), so the fan-out reads it from its
	// cursor, whatever a round running meanwhile did (fanout.go).
	insertEndpointSQL = `
INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, cursor_tx, cursor_seq)
SELECT $1, $2, $3, $4, $5, h.horizon, 0 FROM payments_event_horizon() h
RETURNING status, created_at`

	endpointColumns = `merchant_id, id, url, events, status, created_at`

	listEndpointsSQL = `SELECT ` + endpointColumns + ` FROM webhook_endpoints
WHERE merchant_id = $1 AND deleted_at IS NULL ORDER BY created_at, id`

	getEndpointSQL = `SELECT ` + endpointColumns + ` FROM webhook_endpoints
WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL`

	deleteEndpointSQL = `UPDATE webhook_endpoints SET deleted_at = now()
WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL`

	// waitForFanOutSQL takes the fan-out's lock (deliveries.go) until the
	// transaction ends, before an endpoint stops receiving: a fan-out that
	// read the endpoint live has committed its deliveries by then, so
	// cancelDeliveriesSQL ends them too, and the next one reads the endpoint
	// deleted or disabled. Without it, a fan-out running across the change
	// would leave pending deliveries behind it.
	waitForFanOutSQL = `SELECT pg_advisory_xact_lock($1)`

	// cancelDeliveriesSQL ends an endpoint's pending deliveries, leased or
	// not: a worker that holds one records its attempt, and settles nothing
	// (deliveries.go, RecordAttempt). Claims take pending deliveries only;
	// pruning treats canceled ones as settled.
	cancelDeliveriesSQL = `UPDATE webhook_deliveries SET state = 'canceled', lease_until = NULL, claim = NULL
WHERE merchant_id = $1 AND endpoint_id = $2 AND state = 'pending'`
)

// CreateWebhookEndpoint records a new endpoint of the merchant in a
// transaction of its own (the API creates one inside its idempotency key's
// transaction instead: ledger.CreateWebhookEndpoint). Errors as for
// createEndpoint.
func (s *Webhooks) CreateWebhookEndpoint(ctx context.Context, merchantID uuid.UUID, url string, events []string, secret string) (payment.WebhookEndpoint, error) {
	var e payment.WebhookEndpoint
	err := s.inTx(ctx, func(tx pgx.Tx) (err error) {
		e, err = createEndpoint(ctx, tx, merchantID, url, events, secret)
		return err
	})
	if err != nil {
		return payment.WebhookEndpoint{}, asUnavailable(err)
	}
	return e, nil
}

// createEndpoint records a new endpoint of the merchant on q, a transaction,
// and returns it with its Secret, the only answer that carries it. It holds
// the merchant's row lock until q ends, so two creations cannot both count
// 15. It returns payment.ErrNotFound for an unknown merchant, and
// payment.ErrTooManyWebhookEndpoints when the merchant already has
// payment.MaxWebhookEndpoints live endpoints.
func createEndpoint(ctx context.Context, q querier, merchantID uuid.UUID, url string, events []string, secret string) (payment.WebhookEndpoint, error) {
	e := payment.WebhookEndpoint{ID: payment.NewID(), MerchantID: merchantID, URL: url, Events: events, Secret: secret}
	if err := q.QueryRow(ctx, lockMerchantSQL, merchantID).Scan(); errors.Is(err, pgx.ErrNoRows) {
		return payment.WebhookEndpoint{}, payment.ErrNotFound
	} else if err != nil {
		return payment.WebhookEndpoint{}, fmt.Errorf("lock merchant: %w", err)
	}
	var live int
	if err := q.QueryRow(ctx, countLiveEndpointsSQL, merchantID).Scan(&live); err != nil {
		return payment.WebhookEndpoint{}, fmt.Errorf("count webhook endpoints: %w", err)
	}
	if live >= payment.MaxWebhookEndpoints {
		return payment.WebhookEndpoint{}, fmt.Errorf("%w: your merchant has %d, the most allowed; delete one first",
			payment.ErrTooManyWebhookEndpoints, live)
	}
	if err := q.QueryRow(ctx, insertEndpointSQL, merchantID, e.ID, url, events, secret).Scan(&e.Status, &e.CreatedAt); err != nil {
		return payment.WebhookEndpoint{}, fmt.Errorf("insert webhook endpoint: %w", err)
	}
	return e, nil
}

// WebhookEndpoints returns the merchant's live endpoints, oldest first,
// without their secrets.
func (s *Webhooks) WebhookEndpoints(ctx context.Context, merchantID uuid.UUID) (endpoints []payment.WebhookEndpoint, err error) {
	err = s.read(ctx, func(q querier) error {
		rows, err := q.Query(ctx, listEndpointsSQL, merchantID)
		if err != nil {
			return asUnavailable(fmt.Errorf("list webhook endpoints: %w", err))
		}
		endpoints, err = pgx.CollectRows(rows, scanEndpoint)
		if err != nil {
			return asUnavailable(fmt.Errorf("list webhook endpoints: %w", err))
		}
		return nil
	})
	return endpoints, err
}

// WebhookEndpoint returns the merchant's live endpoint id, without its
// secret, or payment.ErrNotFound.
func (s *Webhooks) WebhookEndpoint(ctx context.Context, merchantID, id uuid.UUID) (e payment.WebhookEndpoint, err error) {
	err = s.read(ctx, func(q querier) error {
		e, err = endpoint(ctx, q, merchantID, id)
		return err
	})
	return e, err
}

func endpoint(ctx context.Context, q querier, merchantID, id uuid.UUID) (payment.WebhookEndpoint, error) {
	rows, err := q.Query(ctx, getEndpointSQL, merchantID, id)
	if err != nil {
		return payment.WebhookEndpoint{}, asUnavailable(fmt.Errorf("read webhook endpoint: %w", err))
	}
	e, err := pgx.CollectExactlyOneRow(rows, scanEndpoint)
	if errors.Is(err, pgx.ErrNoRows) {
		return payment.WebhookEndpoint{}, payment.ErrNotFound
	}
	if err != nil {
		return payment.WebhookEndpoint{}, asUnavailable(fmt.Errorf("read webhook endpoint: %w", err))
	}
	return e, nil
}

// DeleteWebhookEndpoint marks the merchant's live endpoint id deleted and
// cancels its pending deliveries, in one transaction. It returns
// payment.ErrNotFound when the merchant has no such live endpoint, once the
// standby has that too.
func (s *Webhooks) DeleteWebhookEndpoint(ctx context.Context, merchantID, id uuid.UUID) error {
	deleted := false
	run := func(tx pgx.Tx) (err error) {
		deleted, err = deleteEndpoint(ctx, tx, merchantID, id)
		return err
	}
	// Run again after a deadlock. An abandoned delivery's record, which
	// disables the endpoint, used to lock its deliveries before it; records
	// now lock the endpoint first (attempts.go, lockHealthSQL).
	if err := s.inTxRetried(ctx, run); err != nil {
		return asUnavailable(err)
	}
	if !deleted {
		// Nothing written: the answer rests on what an earlier commit did.
		if err := s.confirmCommitted(ctx); err != nil {
			return err
		}
		return payment.ErrNotFound
	}
	return nil
}

// deleteEndpoint marks the endpoint deleted and cancels its pending
// deliveries on tx; it reports whether there was such a live endpoint.
func deleteEndpoint(ctx context.Context, tx pgx.Tx, merchantID, id uuid.UUID) (bool, error) {
	if _, err := tx.Exec(ctx, waitForFanOutSQL, int64(fanOutLockKey)); err != nil {
		return false, fmt.Errorf("wait for the fan-out: %w", err)
	}
	tag, err := tx.Exec(ctx, deleteEndpointSQL, merchantID, id)
	if err != nil {
		return false, fmt.Errorf("delete webhook endpoint: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if _, err := tx.Exec(ctx, cancelDeliveriesSQL, merchantID, id); err != nil {
		return false, fmt.Errorf("cancel the deleted endpoint's deliveries: %w", err)
	}
	return true, nil
}

const (
	// lockEndpointSQL reads the merchant's live endpoint an update is for,
	// locked until the update commits.
	lockEndpointSQL = `SELECT ` + endpointColumns + ` FROM webhook_endpoints
WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL
FOR NO KEY UPDATE`

	// updateEndpointSQL writes an endpoint's url, events and status, and,
	// when $6 is not null, moves its cursor to ($6, 0): the event horizon
	// read by the statement before (horizon.go), as a new endpoint's starts.
	// It forgets what the Deliverer learnt of the endpoint (migration 0021):
	// a merchant who fixed it gets its next attempt at once.
	// Enabling flags it behind, as a new endpoint starts: migration 0022's
	// trigger does, for every release that enables one (fanout.go).
	updateEndpointSQL = `UPDATE webhook_endpoints SET url = $3, events = $4, status = $5,
    failures = 0, paused_until = NULL, in_flight_limit = DEFAULT,
    cursor_tx = coalesce($6::xid8, cursor_tx),
    cursor_seq = CASE WHEN $6::xid8 IS NULL THEN cursor_seq ELSE 0 END
WHERE merchant_id = $1 AND id = $2`

	// lastEventBelowSQL reads the merchant's last event, in the feed's order,
	// of a transaction below the horizon $2 (read by a statement before it,
	// so every such transaction has ended and this one sees it): the last
	// event that a cursor at ($2, 0) has passed (events_feed, backwards).
	lastEventBelowSQL = `SELECT id FROM events WHERE merchant_id = $1 AND tx_id < $2::xid8
ORDER BY tx_id DESC, seq DESC LIMIT 1`
)

// updateEndpoint changes the merchant's live endpoint on q, a transaction,
// as payment.Ledger.UpdateWebhookEndpoint says. An update that changes
// nothing writes nothing. Enabling a disabled endpoint moves its cursor to
// the event horizon, as at its creation, and reads the last event it passes
// over (Resumed); disabling one cancels its pending deliveries.
func updateEndpoint(ctx context.Context, q querier, merchantID, id uuid.UUID, u payment.WebhookEndpointUpdate) (payment.WebhookEndpoint, error) {
	if u.Enabled != nil && !*u.Enabled {
		// Before the endpoint's lock, in the fan-out's order (deleteEndpoint).
		if _, err := q.Exec(ctx, waitForFanOutSQL, int64(fanOutLockKey)); err != nil {
			return payment.WebhookEndpoint{}, fmt.Errorf("wait for the fan-out: %w", err)
		}
	}
	rows, _ := q.Query(ctx, lockEndpointSQL, merchantID, id)
	was, err := pgx.CollectExactlyOneRow(rows, scanEndpoint)
	if errors.Is(err, pgx.ErrNoRows) {
		return payment.WebhookEndpoint{}, payment.ErrNotFound
	}
	if err != nil {
		return payment.WebhookEndpoint{}, fmt.Errorf("lock webhook endpoint: %w", err)
	}
	e := was
	if u.URL != nil {
		e.URL = *u.URL
	}
	if u.Events != nil {
		e.Events = u.Events
	}
	switch {
	case u.Enabled == nil:
	case *u.Enabled:
		e.Status = payment.WebhookEnabled
	default:
		e.Status = payment.WebhookDisabled
	}
	if e.URL == was.URL && slices.Equal(e.Events, was.Events) && e.Status == was.Status {
		return e, nil
	}
	var horizon pgtype.Uint64 // not valid: the cursor stays where it is
	if was.Status == payment.WebhookDisabled && e.Status == payment.WebhookEnabled {
		if e.Resumed, horizon, err = resumption(ctx, q, merchantID); err != nil {
			return payment.WebhookEndpoint{}, err
		}
	}
	if _, err := q.Exec(ctx, updateEndpointSQL, merchantID, id, e.URL, e.Events, e.Status, horizon); err != nil {
		return payment.WebhookEndpoint{}, fmt.Errorf("update webhook endpoint: %w", err)
	}
	if was.Status == payment.WebhookDisabled && e.Status == payment.WebhookEnabled {
		// A disabled endpoint has no pending delivery, but for one a
		// fan-out inserted while its failures disabled it (that disabling
		// does not wait for the fan-out): it would be claimed now, an
		// event of the time the endpoint was disabled, which it does not
		// get. It ends here.
		if _, err := q.Exec(ctx, cancelDeliveriesSQL, merchantID, id); err != nil {
			return payment.WebhookEndpoint{}, fmt.Errorf("cancel the enabled endpoint's leftover deliveries: %w", err)
		}
	}
	if was.Status == payment.WebhookEnabled && e.Status == payment.WebhookDisabled {
		if _, err := q.Exec(ctx, cancelDeliveriesSQL, merchantID, id); err != nil {
			return payment.WebhookEndpoint{}, fmt.Errorf("cancel the disabled endpoint's deliveries: %w", err)
		}
	}
	return e, nil
}

// resumption reads the event horizon, where a re-enabled endpoint's cursor
// is to start, and then the merchant's last event below it: the endpoint
// receives exactly the events after that one in the feed.
func resumption(ctx context.Context, q querier, merchantID uuid.UUID) (*payment.Resumption, pgtype.Uint64, error) {
	h, err := eventHorizon(ctx, q)
	if err != nil {
		return nil, pgtype.Uint64{}, err
	}
	r := &payment.Resumption{}
	err = q.QueryRow(ctx, lastEventBelowSQL, merchantID, h.xid).Scan(&r.After)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, pgtype.Uint64{}, fmt.Errorf("read the last event before the resumption: %w", err)
	}
	return r, h.xid, nil
}

func scanEndpoint(row pgx.CollectableRow) (payment.WebhookEndpoint, error) {
	var e payment.WebhookEndpoint
	err := row.Scan(&e.MerchantID, &e.ID, &e.URL, &e.Events, &e.Status, &e.CreatedAt)
	return e, err
}

const (
	// attemptCursorSQL reads the position of the attempt a page starts
	// after, one of the endpoint's.
	attemptCursorSQL = `SELECT attempted_at FROM webhook_attempts
WHERE merchant_id = $1 AND endpoint_id = $2 AND id = $3`

	// listAttemptsSQL pages an endpoint's attempts newest first, after the
	// cursor ($3, $4) when $3 is not null, reading $5 rows.
	listAttemptsSQL = `SELECT id, endpoint_id, event_id, attempted_at, status, error, latency_ms
FROM webhook_attempts
WHERE merchant_id = $1 AND endpoint_id = $2
  AND ($3::timestamptz IS NULL OR (attempted_at, id) < ($3, $4::uuid))
ORDER BY attempted_at DESC, id DESC
LIMIT $5`
)

// WebhookAttempts returns a page of the attempts to deliver to the
// merchant's live endpoint id, newest first. A deleted endpoint's attempts
// are not readable, as the endpoint is not: payment.ErrNotFound for it and
// for an endpoint the merchant never had. A StartingAfter that names no
// attempt of the endpoint is a *payment.ValidationError.
func (s *Webhooks) WebhookAttempts(ctx context.Context, merchantID, endpointID uuid.UUID, q payment.AttemptQuery) (p payment.Page[payment.RecordedAttempt], err error) {
	err = s.read(ctx, func(db querier) error {
		p, err = attempts(ctx, db, merchantID, endpointID, q)
		return err
	})
	return p, err
}

func attempts(ctx context.Context, db querier, merchantID, endpointID uuid.UUID, q payment.AttemptQuery) (payment.Page[payment.RecordedAttempt], error) {
	if _, err := endpoint(ctx, db, merchantID, endpointID); err != nil {
		return payment.Page[payment.RecordedAttempt]{}, err
	}
	var (
		after   *time.Time
		afterID uuid.UUID
	)
	if q.StartingAfter != nil {
		afterID = *q.StartingAfter
		err := db.QueryRow(ctx, attemptCursorSQL, merchantID, endpointID, afterID).Scan(&after)
		if errors.Is(err, pgx.ErrNoRows) {
			return payment.Page[payment.RecordedAttempt]{}, payment.Invalid("starting_after", "names no attempt of this endpoint")
		}
		if err != nil {
			return payment.Page[payment.RecordedAttempt]{}, asUnavailable(fmt.Errorf("select cursor attempt: %w", err))
		}
	}
	rows, err := db.Query(ctx, listAttemptsSQL, merchantID, endpointID, after, afterID, q.Limit+1)
	if err != nil {
		return payment.Page[payment.RecordedAttempt]{}, asUnavailable(fmt.Errorf("list webhook attempts: %w", err))
	}
	attempts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.RecordedAttempt, error) {
		var (
			a  payment.RecordedAttempt
			ms int64
		)
		err := row.Scan(&a.ID, &a.EndpointID, &a.EventID, &a.At, &a.Status, &a.Error, &ms)
		a.Latency = time.Duration(ms) * time.Millisecond
		return a, err
	})
	if err != nil {
		return payment.Page[payment.RecordedAttempt]{}, asUnavailable(fmt.Errorf("list webhook attempts: %w", err))
	}
	return page(attempts, q.Limit), nil
}

const (
	// resendEndpointSQL reads the live endpoint a resend is for, locked
	// against a concurrent deletion or disabling until the resend commits.
	resendEndpointSQL = `SELECT events, status FROM webhook_endpoints
WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL
FOR NO KEY UPDATE`

	eventTypeSQL = `SELECT type FROM events WHERE merchant_id = $1 AND id = $2`

	// resendSQL makes the delivery pending and due now: a new one, or the
	// existing one. One that had ended (delivered or abandoned) starts a
	// new retry period; a pending one keeps its own, and its lease if a
	// worker holds it (that worker settles it, and the next claim sends
	// it again only if that attempt failed).
	resendSQL = `
INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id) VALUES ($1, $2, $3)
ON CONFLICT (merchant_id, endpoint_id, event_id) DO UPDATE SET
    next_attempt_at = now(),
    first_attempt_at = CASE WHEN webhook_deliveries.state = 'pending' THEN webhook_deliveries.first_attempt_at END,
    state = 'pending'
RETURNING state`
)

// resendEvent schedules the merchant's event to the endpoint again on q, a
// transaction; errors as payment.Ledger.ResendWebhookEvent says.
func resendEvent(ctx context.Context, q querier, merchantID, endpointID, eventID uuid.UUID) (payment.ScheduledDelivery, error) {
	e := payment.WebhookEndpoint{ID: endpointID}
	err := q.QueryRow(ctx, resendEndpointSQL, merchantID, endpointID).Scan(&e.Events, &e.Status)
	if errors.Is(err, pgx.ErrNoRows) {
		return payment.ScheduledDelivery{}, fmt.Errorf("%w: your merchant has no webhook endpoint %q", payment.ErrNotFound,
			payment.FormatID(payment.PrefixWebhookEndpoint, endpointID))
	}
	if err != nil {
		return payment.ScheduledDelivery{}, fmt.Errorf("lock webhook endpoint: %w", err)
	}
	if e.Status != payment.WebhookEnabled {
		return payment.ScheduledDelivery{}, payment.Invalid("webhook_endpoint_id", "the endpoint is %s: it receives no deliveries", e.Status)
	}
	var eventType string
	err = q.QueryRow(ctx, eventTypeSQL, merchantID, eventID).Scan(&eventType)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !e.Subscribes(eventType)) {
		return payment.ScheduledDelivery{}, fmt.Errorf("%w: the endpoint receives no event %q of your merchant", payment.ErrNotFound,
			payment.FormatID(payment.PrefixEvent, eventID))
	}
	if err != nil {
		return payment.ScheduledDelivery{}, fmt.Errorf("read event: %w", err)
	}
	d := payment.ScheduledDelivery{EndpointID: endpointID, EventID: eventID}
	if err := q.QueryRow(ctx, resendSQL, merchantID, endpointID, eventID).Scan(&d.State); err != nil {
		return payment.ScheduledDelivery{}, fmt.Errorf("schedule webhook delivery: %w", err)
	}
	return d, nil
}
