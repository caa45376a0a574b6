package reconcile_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/reconcile"
)

// TestReconcileAfterFaultyTraffic charges 40 cards through the service at
// the real simulator, which fails a tenth of its answers at random besides
// the test methods' own faults, with captures and refunds; once recovery
// has settled every operation, a reconciliation finds every reference
// matched. Then one approval is deleted from our side and one captured
// amount changed by hand: the next run names exactly those two, with what
// disagrees, and the service's last run reads two mismatches.
func TestReconcileAfterFaultyTraffic(t *testing.T) {
	t.Parallel()
	s := startShop(t, "0.1")
	since := time.Now().Add(-time.Second)
	made := s.traffic(t, 40)
	s.settle(t, 90*time.Second)
	until := time.Now().Add(time.Second)

	store, err := postgres.Open(t.Context(), s.dbURL, postgres.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	run := func() reconcile.Report {
		t.Helper()
		r, err := reconcile.Reconcile(t.Context(), store.Reconciliations, s.processor, s.processor.Name(), since, until,
			reconcile.Options{Lag: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	clean := run()
	statuses := map[string]int{}
	for _, l := range clean.Lines {
		statuses[string(l.Ours.Status)]++
	}
	t.Logf("the clean run: %v; our charges: %v", clean.Counts, statuses)
	var inReview int
	if err := s.api.DB.QueryRow(t.Context(), `SELECT count(*) FROM processor_operations WHERE kind = 'authorize' AND state = 'requires_review'`).
		Scan(&inReview); err != nil {
		t.Fatal(err)
	}
	if n := clean.Mismatches(); n != 0 || clean.Counts[reconcile.Matched]+clean.Counts[reconcile.Pending] != len(made) ||
		clean.Counts[reconcile.Pending] != inReview {
		t.Errorf("the clean run: %v (%d mismatches), want %d references matched or, %d of them, in review", clean.Counts, n, len(made), inReview)
		for _, l := range clean.Lines {
			if l.Result != reconcile.Matched {
				t.Logf("  %s %s: %s", l.Reference, l.Result, l.Detail)
			}
		}
	}
	if got := references(clean); !slices.Equal(got, ids(made)) {
		t.Errorf("the clean run's references %v, want the charges' %v", got, ids(made))
	}

	// The planted faults: two approvals, captured and not refunded.
	var victims []charged
	for _, c := range made {
		if c.method == "pm_card_approve" && c.status == "succeeded" && !c.refunded {
			victims = append(victims, c)
		}
	}
	if len(victims) < 2 {
		t.Fatalf("only %d captured approvals to plant faults on", len(victims))
	}
	deleted, changed := victims[0], victims[1]
	var psp string
	if err := s.api.DB.QueryRow(t.Context(), `SELECT psp_reference FROM charges WHERE id = $1`, uuidOf(t, deleted.id)).Scan(&psp); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.DB.Exec(t.Context(), `DELETE FROM processor_operations WHERE id = $1`, uuidOf(t, deleted.id)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.DB.Exec(t.Context(), `UPDATE charges SET amount_captured = 900 WHERE id = $1`, uuidOf(t, changed.id)); err != nil {
		t.Fatal(err)
	}

	planted := run()
	var got []string
	for _, l := range planted.Lines {
		if l.Result.Mismatch() {
			got = append(got, fmt.Sprintf("%s %s: %s", l.Reference, l.Result, l.Detail))
		}
	}
	want := []string{
		deleted.id + " missing_on_our_side: the processor has " + psp + " captured 1000/1000/0; we have no operation under this reference",
		changed.id + " amount_mismatch: captured 900 here, 1000 at the processor",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the planted run's mismatches:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if planted.Mismatches() != 2 || planted.Counts[reconcile.MissingOnOurSide] != 1 || planted.Counts[reconcile.AmountMismatch] != 1 ||
		planted.Counts[reconcile.Matched] != clean.Counts[reconcile.Matched]-2 {
		t.Errorf("the planted run's counts %v, want the clean run's %v less 2 matched, 1 missing on our side, 1 amount mismatch",
			planted.Counts, clean.Counts)
	}

	// What serve's metrics read: the newest run, its two mismatches.
	monitor, err := postgres.OpenMonitor(t.Context(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(monitor.Close)
	last, ok, err := monitor.LastReconciliation(t.Context())
	if err != nil || !ok || last.Mismatches != 2 || !last.FinishedAt.Equal(planted.FinishedAt) {
		t.Errorf("the last run as the metrics read it: %+v, %t, %v; want 2 mismatches, finished at %v", last, ok, err, planted.FinishedAt)
	}
	var runs int
	if err := s.api.DB.QueryRow(t.Context(), `SELECT count(*) FROM reconciliation_runs`).Scan(&runs); err != nil || runs != 2 {
		t.Errorf("%d runs recorded (%v), want 2", runs, err)
	}
}

func references(r reconcile.Report) []string {
	var out []string
	for _, l := range r.Lines {
		out = append(out, l.Reference)
	}
	return out
}

func ids(cs []charged) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.id)
	}
	slices.Sort(out)
	return out
}

func uuidOf(t *testing.T, id string) any {
	t.Helper()
	u, ok := payment.ParseID(payment.PrefixCharge, id)
	if !ok {
		t.Fatalf("%q is no charge id", id)
	}
	return u
}
