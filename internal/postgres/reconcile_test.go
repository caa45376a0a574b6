package postgres

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/reconcile"
)

// TestReconciliationReads: Operations reads the authorizations of the
// processor asked for and of none (made before operations named theirs),
// created in the window or named by a reference, each with its charge and
// its open captures, voids and refunds; never another processor's, a
// capture's own row, or a reference that is no charge id. RecordRun keeps
// a run's counts and the monitor reads the newest run's mismatches.
func TestReconciliationReads(t *testing.T) {
	t.Parallel()
	s, mon := storeAndMonitor(t)
	ctx := t.Context()
	if _, ok, err := mon.LastReconciliation(ctx); ok || err != nil {
		t.Fatalf("before any run: %t, %v; want none", ok, err)
	}
	merchant := uuid.New()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO merchants (id, name) VALUES ($1, 'reconciled')`, merchant); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	add := func(processor *string, created time.Time, status string, captured int64) uuid.UUID {
		t.Helper()
		id := uuid.New()
		if _, err := s.Pool().Exec(ctx, `
WITH charge AS (
    INSERT INTO charges (merchant_id, id, payment_method, amount, currency, status, amount_captured, failure_code)
    VALUES ($1, $2, 'pm_card_approve', 1000, 'EUR', $4, $5, CASE WHEN $4 = 'failed' THEN 'declined' END)
)
INSERT INTO processor_operations (merchant_id, id, charge_id, kind, state, processor, processor_key, amount, currency,
                                  payment_method, capture, decision_deadline, created_at)
VALUES ($1, $2, $2, 'authorize', CASE WHEN $4 = 'failed' THEN 'failed' ELSE 'succeeded' END, $3, 'k', 1000, 'EUR',
        'pm_card_approve', true, $6, $6)`, merchant, id, processor, status, captured, created); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b := "simulator a", "simulator b"
	since, until := now.Add(-time.Hour), now
	inWindow := add(&a, since, "succeeded", 1000)
	legacy := add(nil, now.Add(-time.Minute), "failed", 0)
	add(&b, now.Add(-time.Minute), "succeeded", 1000)        // another processor's
	add(&a, until, "succeeded", 1000)                        // the next window's
	named := add(&a, since.Add(-time.Hour), "authorized", 0) // before the window, named by the processor
	// A refund of inWindow in flight: counted, not read as an operation.
	if _, err := s.Pool().Exec(ctx, `
INSERT INTO processor_operations (merchant_id, id, charge_id, kind, state, processor, processor_key, amount, currency,
                                  payment_method, capture, decision_deadline, next_check_at)
VALUES ($1, $2, $3, 'refund', 'processing', $4, 'k2', 300, 'EUR', 'pm_card_approve', false, now(), now())`,
		merchant, uuid.New(), inWindow, a); err != nil {
		t.Fatal(err)
	}

	ops, err := s.Reconciliations.Operations(ctx, a, since, until,
		[]string{payment.FormatID(payment.PrefixCharge, named), "not-ours", "acct_" + named.String()})
	if err != nil {
		t.Fatal(err)
	}
	ref := func(id uuid.UUID) string { return payment.FormatID(payment.PrefixCharge, id) }
	want := map[string]reconcile.Operation{
		ref(inWindow): {Reference: ref(inWindow), State: "succeeded", Status: "succeeded", Amount: 1000, AmountCaptured: 1000,
			Currency: "EUR", OpenFollowUps: 1, CreatedAt: since},
		ref(legacy): {Reference: ref(legacy), State: "failed", Status: "failed", Amount: 1000, Currency: "EUR", CreatedAt: now.Add(-time.Minute)},
		ref(named):  {Reference: ref(named), State: "succeeded", Status: "authorized", Amount: 1000, Currency: "EUR", CreatedAt: since.Add(-time.Hour)},
	}
	if len(ops) != len(want) {
		t.Fatalf("read %d operations, want %d: %+v", len(ops), len(want), ops)
	}
	for _, o := range ops {
		w := want[o.Reference]
		if !o.CreatedAt.Equal(w.CreatedAt) {
			t.Errorf("%s created %v, want %v", o.Reference, o.CreatedAt, w.CreatedAt)
		}
		// Changed when created (no resolved_at here), or when its refund was.
		if o.Reference == ref(inWindow) && !o.ChangedAt.After(now.Add(-time.Minute)) || o.Reference != ref(inWindow) && !o.ChangedAt.Equal(w.CreatedAt) {
			t.Errorf("%s changed %v", o.Reference, o.ChangedAt)
		}
		o.CreatedAt, o.ChangedAt = w.CreatedAt, time.Time{}
		if o != w {
			t.Errorf("read %+v, want %+v", o, w)
		}
	}

	for i, mismatches := range []int{3, 0} {
		at, err := s.Reconciliations.RecordRun(ctx, reconcile.Run{Processor: a, Since: since, Until: until,
			Counts: map[reconcile.Result]int{reconcile.Matched: 5, reconcile.Pending: 1, reconcile.StateMismatch: mismatches}})
		if err != nil {
			t.Fatal(err)
		}
		last, ok, err := mon.LastReconciliation(ctx)
		if err != nil || !ok || last.Mismatches != int64(mismatches) || !last.FinishedAt.Equal(at) {
			t.Errorf("after run %d: %+v, %t, %v; want %d mismatches at %v", i, last, ok, err, mismatches, at)
		}
	}
}
