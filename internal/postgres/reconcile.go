package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/reconcile"
)

// Reconciliations is the store of payments reconcile (reconcile.Store):
// it reads our authorizations at a processor with their charges, and
// records each run for the metrics, which Monitor.LastReconciliation reads.
type Reconciliations struct{ *db }

// NewReconciliations returns the reconciliation's store on the handle d.
func NewReconciliations(d *DB) *Reconciliations { return &Reconciliations{d.db} }

var _ reconcile.Store = (*Reconciliations)(nil)

const (
	// reconcileOperationsSQL reads the authorizations of processor @processor
	// (or of none: made before operations named theirs) created in
	// [@since, @until) or named by @ids, each with its charge, the count of
	// its charge's captures, voids and refunds still open or in review, and
	// the last change of any of them.
	reconcileOperationsSQL = `
SELECT o.id, o.state, c.status, c.amount, c.amount_captured, c.amount_refunded, c.currency, o.created_at,
       f.open, greatest(o.created_at, o.resolved_at, f.changed)
FROM processor_operations o
JOIN charges c ON c.merchant_id = o.merchant_id AND c.id = o.charge_id
CROSS JOIN LATERAL (
    SELECT (count(*) FILTER (WHERE state IN ('processing', 'requires_review')))::int AS open,
           max(greatest(created_at, resolved_at)) AS changed
    FROM processor_operations
    WHERE merchant_id = o.merchant_id AND charge_id = o.charge_id AND kind <> 'authorize'
) f
WHERE o.kind = 'authorize' AND (o.processor = @processor OR o.processor IS NULL)
  AND ((o.created_at >= @since AND o.created_at < @until) OR o.id = ANY(@ids::uuid[]))
ORDER BY o.id`

	insertReconciliationSQL = `
INSERT INTO reconciliation_runs (processor, window_start, window_end, matched, pending, missing_on_our_side,
                                 missing_at_processor, amount_mismatch, state_mismatch)
VALUES (@processor, @since, @until, @matched, @pending, @missing_on_our_side,
        @missing_at_processor, @amount_mismatch, @state_mismatch)
RETURNING finished_at`

	// lastReconciliationSQL reads the newest run's mismatches and when it
	// finished.
	lastReconciliationSQL = `
SELECT missing_on_our_side + missing_at_processor + amount_mismatch + state_mismatch, finished_at
FROM reconciliation_runs ORDER BY finished_at DESC, id DESC LIMIT 1`
)

// Operations returns our authorizations at processor created in [since,
// until), and those whose reference is in refs (a reference that is no
// charge id is none of ours). It returns an error wrapping
// payment.ErrUnavailable when the database is unreachable.
func (s *Reconciliations) Operations(ctx context.Context, processor string, since, until time.Time, refs []string) ([]reconcile.Operation, error) {
	ids := make([]uuid.UUID, 0, len(refs))
	for _, ref := range refs {
		if id, ok := payment.ParseID(payment.PrefixCharge, ref); ok {
			ids = append(ids, id)
		}
	}
	rows, err := s.pool.Query(ctx, reconcileOperationsSQL, pgx.NamedArgs{"processor": processor, "since": since, "until": until, "ids": ids})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("select operations to reconcile: %w", err))
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (reconcile.Operation, error) {
		var (
			o  reconcile.Operation
			id uuid.UUID
		)
		err := row.Scan(&id, &o.State, &o.Status, &o.Amount, &o.AmountCaptured, &o.AmountRefunded, &o.Currency, &o.CreatedAt, &o.OpenFollowUps, &o.ChangedAt)
		o.Reference = payment.FormatID(payment.PrefixCharge, id)
		return o, err
	})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("select operations to reconcile: %w", err))
	}
	return ops, nil
}

// RecordRun stores r's counts, confirmed by the synchronous standby if any,
// and returns when it finished, by the database's clock.
func (s *Reconciliations) RecordRun(ctx context.Context, r reconcile.Run) (time.Time, error) {
	c := r.Counts
	var at time.Time
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, insertReconciliationSQL, pgx.NamedArgs{"processor": r.Processor, "since": r.Since, "until": r.Until,
			"matched": c[reconcile.Matched], "pending": c[reconcile.Pending], "missing_on_our_side": c[reconcile.MissingOnOurSide],
			"missing_at_processor": c[reconcile.MissingAtProcessor], "amount_mismatch": c[reconcile.AmountMismatch],
			"state_mismatch": c[reconcile.StateMismatch]}).Scan(&at)
	})
	if err != nil {
		return time.Time{}, asUnavailable(fmt.Errorf("insert reconciliation run: %w", err))
	}
	return at, nil
}

// LastReconciliation is the newest run of payments reconcile, as the
// metrics show it.
type LastReconciliation struct {
	Mismatches int64
	FinishedAt time.Time
}

// LastReconciliation reads the newest run on the monitor's connection; ok
// is false when there has been none. It returns an error wrapping
// payment.ErrUnavailable when the database fails.
func (m *Monitor) LastReconciliation(ctx context.Context) (last LastReconciliation, ok bool, err error) {
	err = m.pool.QueryRow(ctx, lastReconciliationSQL).Scan(&last.Mismatches, &last.FinishedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return LastReconciliation{}, false, nil
	case err != nil:
		return LastReconciliation{}, false, asUnavailable(fmt.Errorf("select the last reconciliation: %w", err))
	}
	return last, true, nil
}
