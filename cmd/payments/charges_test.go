package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestChargesResolve runs charges resolve for real while serve runs: a card
// charge in review (its rows as recovery leaves them: the charge and its
// operation in requires_review, the key bound to it with no response), whose
// retry answers 202, is settled as failed; the command prints the charge,
// the key's retry now answers the stored 402, replayed byte for byte, and
// the audit has its row. A second resolution and every mistake refuse,
// printing nothing and changing nothing.
func TestChargesResolve(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	// A processor nobody answers at: the key bound to the charge never
	// calls it, and recovery does not look at a charge in review.
	env := envOf(map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0",
		"RELAY_ENABLED": "false", "WEBHOOK_DELIVERY": "false", "SHUTDOWN_DELAY": "0", "PROCESSOR_URL": "http://127.0.0.1:1"})
	ctx := context.Background()
	cli := func(args ...string) ([]byte, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(ctx, args, env, &out, io.Discard)
		return out.Bytes(), err
	}
	if _, err := cli("migrate", "up"); err != nil {
		t.Fatal(err)
	}
	out, err := cli("merchants", "create", "--name", "Reviewed")
	if err != nil {
		t.Fatal(err)
	}
	var merchant struct {
		MerchantID string `json:"merchant_id"`
		APIKey     string `json:"api_key"`
	}
	if err := json.Unmarshal(out, &merchant); err != nil {
		t.Fatal(err)
	}
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	const key, body = "k-in-review", `{"payment_method": "pm_card_approve", "amount": 1000, "currency": "EUR"}`
	id := chargeInReview(t, db, uuid.MustParse(merchant.MerchantID), key, body)

	logs := &testkit.LogBuffer{}
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(serveCtx, []string{"serve"}, env, io.Discard, logs) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
	})
	addr := waitForAddr(t, logs)
	charge := func() (int, []byte, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/charges", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+merchant.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b, resp.Header
	}
	if status, b, _ := charge(); status != http.StatusAccepted || !bytes.Contains(b, []byte(`"status":"requires_review"`)) {
		t.Fatalf("the retry in review: %d %s, want 202 requires_review", status, b)
	}

	out, err = cli("charges", "resolve", id, "--as", "failed", "--reason", "procsim audit: no approval under "+id, "--operator", "alice")
	if err != nil {
		t.Fatalf("charges resolve: %v", err)
	}
	var printed struct {
		ID          string `json:"id"`
		Status      string `json:"status"`
		FailureCode string `json:"failure_code"`
	}
	if err := json.Unmarshal(out, &printed); err != nil || printed.ID != id || printed.Status != "failed" || printed.FailureCode != "operator-resolved" {
		t.Fatalf("charges resolve printed %s (%v), want the charge failed (operator-resolved)", out, err)
	}
	status, final, _ := charge()
	if status != http.StatusPaymentRequired || !bytes.Contains(final, []byte(`"code":"card-charge-failed"`)) ||
		!bytes.Contains(final, []byte(`"charge_id":"`+id+`"`)) {
		t.Fatalf("the retry after: %d %s, want the stored 402 card-charge-failed", status, final)
	}
	if status, again, h := charge(); status != http.StatusPaymentRequired || !bytes.Equal(again, final) || h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the replay: %d %s, want %s byte for byte", status, again, final)
	}
	settled := func() (string, int, int) {
		t.Helper()
		var failure string
		var events, resolutions int
		if err := db.QueryRow(ctx, `
SELECT (SELECT failure_code FROM charges WHERE id = $1),
       (SELECT count(*) FROM events WHERE aggregate_id = $1 AND type = 'charge.failed'),
       (SELECT count(*) FROM charge_resolutions WHERE charge_id = $1 AND operator = 'alice' AND reason LIKE 'procsim audit:%')`,
			uuidOfCharge(t, id)).Scan(&failure, &events, &resolutions); err != nil {
			t.Fatal(err)
		}
		return failure, events, resolutions
	}
	if failure, events, resolutions := settled(); failure != "operator-resolved" || events != 1 || resolutions != 1 {
		t.Errorf("failure code %s, %d charge.failed events, %d audit rows; want operator-resolved, 1, 1", failure, events, resolutions)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"charges", "resolve", id, "--as", "succeeded", "--reason", "twice", "--operator", "bob"},
			"the charge is not in review: charge " + id + " is failed"},
		{[]string{"charges", "resolve", "ch_0123456789abcdef0123456789abcdef", "--as", "failed", "--reason", "r", "--operator", "bob"},
			"unknown card charge ch_0123456789abcdef0123456789abcdef"},
		{[]string{"charges", "resolve", "--as", "failed", "--reason", "r", "--operator", "bob", id, "extra"}, `unexpected argument "extra"`},
		{[]string{"charges", "resolve", "--as", "failed", "--reason", "r", "--operator", "bob"}, "name the charge to settle"},
		{[]string{"charges", "resolve", "acct_1", "--as", "failed", "--reason", "r", "--operator", "bob"}, `"acct_1" is not a charge id`},
		{[]string{"charges", "resolve", id, "--reason", "r", "--operator", "bob"}, "--as is required"},
		{[]string{"charges", "resolve", id, "--as", "failed", "--operator", "bob"}, "--reason is required"},
		{[]string{"charges", "resolve", id, "--as", "failed", "--reason", "r"}, "--operator is required"},
		{[]string{"charges", "resolve", id, "--as", "authorized", "--reason", "r", "--operator", "bob"}, "as: must be succeeded"},
		{[]string{"charges", "resolve", id, "--as", "failed", "--reason", "   ", "--operator", "bob"}, "reason: is required"},
		{[]string{"charges", "resolve", id, "--as", "failed", "--reason", strings.Repeat("r", 501), "--operator", "bob"}, "reason: must be at most 500 characters"},
		{[]string{"charges", "settle", id}, `unknown charges command "settle"`},
		{[]string{"charges"}, "usage:"},
	} {
		out, err := cli(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || len(out) != 0 {
			t.Errorf("%s: %v, printed %q; want an error containing %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	if failure, events, resolutions := settled(); failure != "operator-resolved" || events != 1 || resolutions != 1 {
		t.Errorf("after the refusals: failure code %s, %d charge.failed events, %d audit rows; want nothing changed", failure, events, resolutions)
	}
	if status, again, _ := charge(); status != http.StatusPaymentRequired || !bytes.Equal(again, final) {
		t.Errorf("the replay after the refusals: %d %s, want %s", status, again, final)
	}
}

// chargeInReview writes a card charge in review as recovery leaves one: the
// charge and its operation in requires_review, with no next check, and the
// merchant's key, bound to it with no response, fingerprinting the
// request POST /v1/charges body. It returns the charge's id.
func chargeInReview(t *testing.T, db *pgxpool.Pool, merchant uuid.UUID, key, body string) string {
	t.Helper()
	canonical, err := idempotency.Canonicalize([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	fp := idempotency.NewFingerprint(http.MethodPost, "/v1/charges", canonical)
	id := payment.NewID()
	ref := payment.FormatID(payment.PrefixCharge, id)
	if _, err := db.Exec(context.Background(), `
WITH charge AS (
    INSERT INTO charges (merchant_id, id, payment_method, amount, currency, status)
    VALUES ($1, $2, 'pm_card_approve', 1000, 'EUR', 'requires_review')
), op AS (
    INSERT INTO processor_operations (merchant_id, id, charge_id, kind, state, processor_key, amount, currency,
                                      payment_method, capture, decision_deadline, reversal_attempts, reversal_round, last_code)
    VALUES ($1, $2, $2, 'authorize', 'requires_review', $3 || ':authorize', 1000, 'EUR',
            'pm_card_approve', true, now(), 5, 1, 'reversal_refused')
)
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, operation_id) VALUES ($1, $4, $5, $2)`,
		merchant, id, ref, key, fp[:]); err != nil {
		t.Fatal(err)
	}
	return ref
}

// uuidOfCharge is the uuid of a charge id (ch_...).
func uuidOfCharge(t *testing.T, id string) uuid.UUID {
	t.Helper()
	u, ok := payment.ParseID(payment.PrefixCharge, id)
	if !ok {
		t.Fatalf("%q is no charge id", id)
	}
	return u
}
