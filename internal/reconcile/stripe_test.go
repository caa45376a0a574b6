package reconcile_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/processor/stripeproc"
	"github.com/exactlyonce/payments/internal/reconcile"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/stripefake"
)

// TestReconcileWithStripe reconciles card charges made through the Stripe
// connector, at the Stripe-shaped fake (some answers lost, the search
// lagging), against Stripe's PaymentIntents listed by creation time, a page
// of 100 at a time: every reference matched. Then one captured amount is
// changed by hand, and the run names exactly that one.
func TestReconcileWithStripe(t *testing.T) {
	t.Parallel()
	fake := stripefake.Start(t)
	fake.SearchLag = 500 * time.Millisecond
	p, err := stripeproc.New(t.Context(), stripeproc.Config{APIKey: "sk_test_123", APIBase: fake.URL, Account: "acct_fake",
		MaxNetworkRetries: -1, HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	o := cards.Options{Processor: p, CallTimeout: 2 * time.Second, DecisionDeadline: 30 * time.Second, Wait: 800 * time.Millisecond,
		Interval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
		Poll: 20 * time.Millisecond, KeyWait: 3 * time.Second}
	dbURL := pgtest.NewDatabase(t)
	s := &shop{api: testkit.StartAPI(t, dbURL, testkit.APIOptions{Cards: &o}), dbURL: dbURL, processor: p,
		methods: []string{"pm_card_visa", "pm_card_chargeDeclinedInsufficientFunds", "pm_card_visa"}, client: &http.Client{Timeout: 30 * time.Second}}
	since := time.Now().Add(-2 * time.Second)
	fake.Fail(stripefake.LoseAnswer, "", "", stripefake.LoseAnswer, "", stripefake.ServerError)
	made := s.traffic(t, 24)
	s.settle(t, 60*time.Second)
	until := time.Now().Add(2 * time.Second)

	store, err := postgres.Open(t.Context(), dbURL, postgres.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	run := func() reconcile.Report {
		t.Helper()
		r, err := reconcile.Reconcile(t.Context(), store.Reconciliations, p, p.Name(), since, until, reconcile.Options{Lag: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	clean := run()
	if clean.Mismatches() != 0 || clean.Counts[reconcile.Matched] != len(made) {
		t.Errorf("the clean run: %v, want all %d references matched", clean.Counts, len(made))
		for _, l := range clean.Lines {
			if l.Result != reconcile.Matched {
				t.Logf("  %s %s: %s", l.Reference, l.Result, l.Detail)
			}
		}
	}
	if got := references(clean); !slices.Equal(got, ids(made)) {
		t.Errorf("the clean run's references %v, want the charges' %v", got, ids(made))
	}
	if n := len(fake.Intents()); n != len(made) {
		t.Errorf("%d intents at Stripe for %d charges, want one each", n, len(made))
	}

	var changed charged
	for _, c := range made {
		if c.status == "succeeded" && !c.refunded {
			changed = c
			break
		}
	}
	if _, err := s.api.DB.Exec(t.Context(), `UPDATE charges SET amount_captured = 900 WHERE id = $1`, uuidOf(t, changed.id)); err != nil {
		t.Fatal(err)
	}
	planted := run()
	var got []string
	for _, l := range planted.Lines {
		if l.Result.Mismatch() {
			got = append(got, l.Reference+" "+string(l.Result)+": "+l.Detail)
		}
	}
	if want := []string{changed.id + " amount_mismatch: captured 900 here, 1000 at the processor"}; !slices.Equal(got, want) {
		t.Errorf("the planted run's mismatches %q, want %q", got, want)
	}
}
