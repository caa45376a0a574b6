package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestReconcileCommand runs payments reconcile for real against the
// simulator: a window whose two card charges agree prints them matched in
// JSON and succeeds; once the simulator also holds a payment under a
// reference we have no operation for, the command prints it in CSV and
// exits 2; every run is recorded. A command that cannot run (no window, a
// bad format, no processor, the processor down) fails, exits 1 and records
// nothing.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	sim := procsimtest.Start(t)
	env := envOf(map[string]string{"DATABASE_URL": dbURL, "PROCESSOR_URL": sim.URL()})
	ctx := context.Background()
	cli := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(ctx, args, env, &out, io.Discard)
		return out.String(), err
	}
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	p := processor.NewSimulator(sim.URL(), http.DefaultClient)
	merchant := uuid.New()
	if _, err := db.Exec(ctx, `INSERT INTO merchants (id, name) VALUES ($1, 'reconciled')`, merchant); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second).UTC()
	captured := cardCharge(t, db, p, merchant, true)
	held := cardCharge(t, db, p, merchant, false)
	window := []string{"--since", since.Format(time.RFC3339Nano), "--until", time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano),
		"--settle", "0s"}

	out, err := cli(append([]string{"reconcile"}, window...)...)
	if err != nil {
		t.Fatalf("a clean window: %v\n%s", err, out)
	}
	var report struct {
		Processor  string         `json:"processor"`
		Counts     map[string]int `json:"counts"`
		Mismatches int            `json:"mismatches"`
		References []struct {
			Reference, Result string
			Ours              struct{ Status string }
			Processor         []struct {
				PSPReference string `json:"psp_reference"`
				Status       string
			}
		} `json:"references"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if report.Processor != p.Name() || report.Mismatches != 0 || report.Counts["matched"] != 2 || len(report.References) != 2 {
		t.Errorf("the clean window's report: %s", out)
	}
	for _, r := range report.References {
		want := map[string][3]string{captured.ref: {"succeeded", captured.psp, "captured"}, held.ref: {"authorized", held.psp, "authorized"}}[r.Reference]
		if r.Result != "matched" || len(r.Processor) != 1 || [3]string{r.Ours.Status, r.Processor[0].PSPReference, r.Processor[0].Status} != want {
			t.Errorf("reference %s: %+v, want matched %v", r.Reference, r, want)
		}
	}

	// A payment at the processor under a reference we have no operation for.
	stray := payment.FormatID(payment.PrefixCharge, uuid.New())
	res := p.Authorize(ctx, processor.Authorization{Key: "k-stray", Reference: stray, Amount: 700, Currency: "EUR",
		PaymentMethod: "pm_card_approve", Capture: true})
	out, err = cli(append([]string{"reconcile", "--format", "csv"}, window...)...)
	if exitCode(err) != 2 || err.Error() != "reconcile: 1 references disagree with the processor (listed on stdout)" {
		t.Errorf("a window with a mismatch: %v (exit %d), want exit 2", err, exitCode(err))
	}
	rows := map[string]string{
		captured.ref: captured.ref + ",matched,,succeeded,1000,1000,0,EUR,captured,1000,1000,0," + captured.psp,
		held.ref:     held.ref + ",matched,,authorized,1000,0,0,EUR,authorized,1000,0,0," + held.psp,
		stray: stray + ",missing_on_our_side,the processor has " + res.Payment.PSPReference +
			" captured 700/700/0; we have no operation under this reference,,,,,EUR,captured,700,700,0," + res.Payment.PSPReference,
	}
	want := "reference,result,detail,our_status,our_amount,our_captured,our_refunded,currency,processor_status,processor_approved,processor_captured,processor_refunded,psp_references\n"
	for _, ref := range slices.Sorted(maps.Keys(rows)) {
		want += rows[ref] + "\n"
	}
	if out != want {
		t.Errorf("the CSV report:\n%s\nwant:\n%s", out, want)
	}
	runs := func() (n, mismatches int) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(missing_on_our_side + state_mismatch + amount_mismatch + missing_at_processor), 0)
			FROM reconciliation_runs`).Scan(&n, &mismatches); err != nil {
			t.Fatal(err)
		}
		return n, mismatches
	}
	if n, m := runs(); n != 2 || m != 1 {
		t.Errorf("%d runs recorded with %d mismatches, want 2 with 1", n, m)
	}

	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"reconcile"}, "--since is required"},
		{nil, []string{"reconcile", "--since", "yesterday"}, `--since: "yesterday" is neither an RFC 3339 time`},
		{nil, []string{"reconcile", "--since", "2026-12-05", "--until", "2026-12-04"}, "must be before --until"},
		{nil, []string{"reconcile", "--since", "2999-01-01", "--until", "2999-01-02"}, "is in the future"},
		{nil, append([]string{"reconcile", "--format", "xml"}, window...), `--format must be json or csv, not "xml"`},
		{nil, append([]string{"reconcile", "extra"}, window...), `unexpected argument "extra"`},
		{map[string]string{"PROCESSOR_URL": ""}, append([]string{"reconcile"}, window...), "no card processor is configured"},
		{map[string]string{"PROCESSOR": "stripe", "PROCESSOR_URL": "", "STRIPE_API_KEY": "sk_test_x", "STRIPE_API_BASE": "http://127.0.0.1:1",
			"STRIPE_ACCOUNT": "acct_x"}, append([]string{"reconcile"}, window...), "reconcile: read the processor's payments: processor: outcome unknown"},
		{map[string]string{"PROCESSOR_URL": "http://127.0.0.1:1"}, append([]string{"reconcile"}, window...),
			"reconcile: read the processor's payments: processor: outcome unknown"},
	} {
		vars := map[string]string{"DATABASE_URL": dbURL, "PROCESSOR_URL": sim.URL()}
		for k, v := range tc.env {
			vars[k] = v
		}
		var out bytes.Buffer
		err := run(ctx, tc.args, envOf(vars), &out, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || exitCode(err) != 1 || out.Len() != 0 {
			t.Errorf("%s: %v (exit %d), printed %q; want exit 1 with an error containing %q", strings.Join(tc.args, " "), err, exitCode(err), out.String(), tc.want)
		}
	}
	if n, _ := runs(); n != 2 {
		t.Errorf("%d runs recorded after the failures, want still 2", n)
	}
	servedMetrics(t, dbURL, sim.URL())
}

// servedMetrics starts serve on the database at dbURL, whose newest run
// found 1 mismatch, and waits for its /metrics to show that run; the
// mismatch alert's expression holds over that scrape, the staleness
// alert's does not.
func servedMetrics(t *testing.T, dbURL, processorURL string) {
	t.Helper()
	rules := newRuleEvaluator(t)
	var finished time.Time
	db, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(t.Context(), `SELECT max(finished_at) FROM reconciliation_runs`).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"DATABASE_URL": dbURL, "PROCESSOR_URL": processorURL, "HTTP_ADDR": "127.0.0.1:0",
		"METRICS_ADDR": "127.0.0.1:0", "METRICS_SAMPLE": "1s", "RELAY_ENABLED": "false", "WEBHOOK_DELIVERY": "false", "SHUTDOWN_DELAY": "0"})
	logs := &testkit.LogBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, io.Discard, logs) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
	}()
	addr := waitForMetricsAddr(t, logs)
	want := []string{"payments_reconcile_mismatches 1\n",
		fmt.Sprintf("payments_reconcile_last_run_timestamp_seconds %s\n", strconv.FormatFloat(float64(finished.UnixMilli())/1000, 'g', -1, 64))}
	deadline := time.Now().Add(10 * time.Second)
	for {
		text := scrape(t, addr)
		if strings.Contains(text, want[0]) && strings.Contains(text, want[1]) {
			rules.check(t, "PaymentsReconcileMismatches", []string{text}, true)
			rules.check(t, "PaymentsReconcileStale", []string{text}, false)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve's /metrics lacks %q:\n%s", want, grepLines(text, "payments_reconcile_"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// card is a card charge as the test made it.
type card struct{ ref, psp string }

// cardCharge authorizes 1000 EUR at the simulator (captured if capture) and
// writes the charge and its operation as the service leaves them settled.
func cardCharge(t *testing.T, db *pgxpool.Pool, p *processor.Simulator, merchant uuid.UUID, capture bool) card {
	t.Helper()
	id := payment.NewID()
	ref := payment.FormatID(payment.PrefixCharge, id)
	res := p.Authorize(t.Context(), processor.Authorization{Key: ref + ":authorize", Reference: ref, Amount: 1000, Currency: "EUR",
		PaymentMethod: "pm_card_approve", Capture: capture})
	if res.Outcome != processor.Approved {
		t.Fatalf("authorize %s: %+v", ref, res)
	}
	status, amountCaptured := "authorized", 0
	if capture {
		status, amountCaptured = "succeeded", 1000
	}
	if _, err := db.Exec(t.Context(), `
WITH charge AS (
    INSERT INTO charges (merchant_id, id, payment_method, amount, currency, status, amount_captured, psp_reference)
    VALUES ($1, $2, 'pm_card_approve', 1000, 'EUR', $3, $4, $5)
)
INSERT INTO processor_operations (merchant_id, id, charge_id, kind, state, processor, processor_key, amount, currency,
                                  payment_method, capture, psp_reference, decision_deadline, resolved_at)
VALUES ($1, $2, $2, 'authorize', 'succeeded', $6, $7, 1000, 'EUR', 'pm_card_approve', $8, $5, now(), now())`,
		merchant, id, status, amountCaptured, res.Payment.PSPReference, p.Name(), ref+":authorize", capture); err != nil {
		t.Fatal(err)
	}
	return card{ref: ref, psp: res.Payment.PSPReference}
}
