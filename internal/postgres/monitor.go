package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Monitor reads the outbox's state for the metrics on a connection of its own
// (at most one), so sampling never takes a connection from the payments.
type Monitor struct{ pool *pgxpool.Pool }

// OpenMonitor returns a Monitor of the database at databaseURL; it connects
// on first use. It returns an error only for an invalid URL.
func OpenMonitor(ctx context.Context, databaseURL string) (*Monitor, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "payments-metrics"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create monitor pool: %w", err)
	}
	return &Monitor{pool: pool}, nil
}

// OutboxState is a reading of the outbox, for the metrics and the operator.
type OutboxState struct {
	// Backlog is how many events wait to be published, Oldest the age of the
	// oldest of them.
	Backlog int64
	Oldest  time.Duration
	// Held is how long the oldest committed event has waited behind the event
	// horizon (horizon.go): listed by neither the feed nor the relay, because
	// an older transaction of this database still runs. 0 when none waits.
	Held time.Duration
	// Holder is the transaction that holds the horizon back, if one does.
	Holder *HorizonHolder
}

// heldSQL is the age of the oldest committed event at or above the horizon
// ($1, read by the statement before). The relay has not published it (it
// cannot): it is after the cursor.
const heldSQL = `
SELECT extract(epoch FROM now() - min(created_at))::float8
FROM unpublished_events WHERE tx_id >= $1::xid8`

// Outbox reads the backlog and what holds the event horizon back, on the
// monitor's connection.
func (m *Monitor) Outbox(ctx context.Context) (OutboxState, error) {
	var st OutboxState
	var err error
	if st.Backlog, st.Oldest, err = backlog(ctx, m.pool); err != nil {
		return OutboxState{}, err
	}
	h, err := eventHorizon(ctx, m.pool)
	if err != nil {
		return OutboxState{}, err
	}
	var held *float64
	if err := m.pool.QueryRow(ctx, heldSQL, h.xid).Scan(&held); err != nil {
		return OutboxState{}, asUnavailable(fmt.Errorf("events held: %w", err))
	}
	if held != nil {
		st.Held = max(0, time.Duration(*held*float64(time.Second)))
	}
	st.Holder = h.holder()
	return st, nil
}

// DueCountBound is the most due deliveries a DeliveryState counts: past it,
// the count stays at the bound and Overdue says how far behind delivery is.
// It keeps a sample's cost bounded whatever the backlog.
const DueCountBound = 10_000

// DeliveryState is a reading of the webhook deliveries, for the metrics.
type DeliveryState struct {
	// Due is how many pending deliveries of live enabled endpoints are due
	// (their next attempt's time has come; those in flight included), up to
	// DueCountBound.
	Due int64
	// Overdue is how long the most overdue of them has waited since it came
	// due: its first attempt's time, or its last failure's plus the backoff.
	// A failing endpoint's deliveries waiting out their backoff are not due,
	// and do not count. 0 when none is due.
	Overdue time.Duration
}

// dueSQL reads DeliveryState: the due deliveries in due order along
// webhook_deliveries_due_at (migration 0019), up to the bound, skipping
// those of deleted or disabled endpoints, which no claim takes.
const dueSQL = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(due.next_attempt_at)), 0)::float8
FROM (
    SELECT d.next_attempt_at FROM webhook_deliveries d
    JOIN webhook_endpoints e ON e.merchant_id = d.merchant_id AND e.id = d.endpoint_id
    WHERE d.state = 'pending' AND d.next_attempt_at <= now()
      AND e.deleted_at IS NULL AND e.status = 'enabled'
    ORDER BY d.next_attempt_at
    LIMIT $1
) due`

// Deliveries reads the due webhook deliveries on the monitor's connection.
// It returns an error wrapping payment.ErrUnavailable when the database
// fails.
func (m *Monitor) Deliveries(ctx context.Context) (DeliveryState, error) {
	var st DeliveryState
	var overdue float64
	if err := m.pool.QueryRow(ctx, dueSQL, DueCountBound).Scan(&st.Due, &overdue); err != nil {
		return DeliveryState{}, asUnavailable(fmt.Errorf("due webhook deliveries: %w", err))
	}
	st.Overdue = max(0, time.Duration(overdue*float64(time.Second)))
	return st, nil
}

// Close closes the monitor's connection.
func (m *Monitor) Close() { m.pool.Close() }
