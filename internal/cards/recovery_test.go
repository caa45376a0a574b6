package cards_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/procsim"
	"github.com/exactlyonce/payments/internal/testkit"
)

// signedEvent is the body of a simulator webhook announcing the charge's
// payment in status; postEvent signs it as the simulator does.
func (b *bundle) signedEvent(t *testing.T, eventID, chargeID, status string) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{"id": eventID, "type": "payment.authorized",
		"payment": map[string]any{"psp_reference": "psp_test", "reference": chargeID, "status": status,
			"amount": 1000, "currency": "EUR", "payment_method": "pm_card_approve"}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func (b *bundle) postEvent(t *testing.T, body []byte) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.api.URL+"/v1/processor/events", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(procsim.SignatureHeader, procsim.Sign(webhookSecret, time.Now(), body))
	return b.do(t, req)
}

func TestAsyncPendingIsResolvedByTheSignedWebhookOnce(t *testing.T) {
	t.Parallel()
	// Checks far apart: the webhook resolves it, not a lookup.
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, Backoff: 20 * time.Second, MaxBackoff: 20 * time.Second})
	first := b.charge(t, "k-async", "pm_card_async_pending")
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if r.processorEvents != 1 {
		t.Errorf("%d processor events recorded, want 1", r.processorEvents)
	}
	if n := b.api.Cards.Stats.Lookups.Load(); n != 1 {
		t.Errorf("%d lookups, want the one that confirmed the webhook", n)
	}
	// The same event again (at least once delivery), and one that does not
	// verify: neither changes anything.
	ev := b.signedEvent(t, "evt_dup", id, "authorized")
	for range 2 {
		if a := b.postEvent(t, ev); a.status != http.StatusOK {
			t.Fatalf("webhook: %d %s", a.status, a.body)
		}
	}
	forged, _ := http.NewRequest(http.MethodPost, b.api.URL+"/v1/processor/events", bytes.NewReader(ev))
	forged.Header.Set(procsim.SignatureHeader, procsim.Sign("not the secret", time.Now(), ev))
	if a := b.do(t, forged); a.status != http.StatusBadRequest {
		t.Errorf("forged webhook: %d %s, want 400", a.status, a.body)
	}
	r = b.rowsOf(t, id)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if r.processorEvents != 2 {
		t.Errorf("%d processor events recorded, want 2 (the simulator's, and evt_dup once)", r.processorEvents)
	}
	if a := b.audit(t, id); a.Approvals != 1 {
		t.Errorf("audit %+v", a)
	}
	if n := b.api.Cards.Stats.Lookups.Load(); n != 1 {
		t.Errorf("%d lookups after the duplicate, want still 1: an event that changes nothing calls no one", n)
	}
}

// TestWebhookApprovalIsConfirmedBeforeItIsShown: an approval whose answer
// the processor never delivered (a 500 after processing) is announced by its
// webhook alone. The service confirms it by a lookup, an answer the
// processor knows it gave, before it shows the charge succeeded: otherwise
// the processor cancels the approval at its decision deadline as one it
// never answered, and the merchant is told of money that never comes (found
// by TestProcessorFaults, with the simulator's own faults on
// pm_card_async_pending).
func TestWebhookApprovalIsConfirmedBeforeItIsShown(t *testing.T) {
	t.Parallel()
	// Checks far apart: the webhook resolves it, not recovery's lookups.
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, Backoff: 20 * time.Second, MaxBackoff: 20 * time.Second})
	first := b.charge(t, "k-announced", "pm_card_5xx_after")
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	if a := b.postEvent(t, b.signedEvent(t, "evt_announced", id, "authorized")); a.status != http.StatusOK {
		t.Fatalf("webhook: %d %s", a.status, a.body)
	}
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	// Past the simulator's decision deadline (4 s), and its worker's round.
	time.Sleep(5 * time.Second)
	if a := b.audit(t, id); a.Approvals != 1 || a.Expiries != 0 {
		t.Errorf("the simulator's audit %+v: want the approval kept, none expired", a)
	}
	r = b.rowsOf(t, id)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
}

func TestUnknownOutcomeIsReversedAfterRefusals(t *testing.T) {
	t.Parallel()
	// The answer is lost and every lookup fails: past the decision
	// deadline the outcome is still unknown, so the charge is reversed; the
	// simulator refuses the reversal 3 times, then accepts it.
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, CallTimeout: 500 * time.Millisecond, DecisionDeadline: 2 * time.Second})
	b.proxy.loseAuthorizations.Store(true)
	b.proxy.failLookups.Store(true)
	first := b.charge(t, "k-reverse", "pm_card_reversal_refused_3")
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "reversed", 15*time.Second)
	wantEvents(t, r, "charge.processing", "charge.reversing", "charge.reversed")
	if a := b.audit(t, id); a.Approvals != 1 || a.Reversals != 1 || a.ReversalRefusals != 3 {
		t.Errorf("audit %+v, want 1 approval, 3 refusals, 1 reversal", a)
	}
	final := b.charge(t, "k-reverse", "pm_card_reversal_refused_3")
	if final.status != http.StatusPaymentRequired || !bytes.Contains(final.body, []byte(`"code":"charge-reversed"`)) {
		t.Fatalf("retry: %d %s, want the stored 402 charge-reversed", final.status, final.body)
	}
	requireReplay(t, b, "k-reverse", "pm_card_reversal_refused_3", final)
}

func TestReversalRefusedTooOftenGoesToReview(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, CallTimeout: 500 * time.Millisecond, DecisionDeadline: 2 * time.Second})
	b.proxy.loseAuthorizations.Store(true)
	b.proxy.failLookups.Store(true)
	b.proxy.failReverses.Store(true)
	first := b.charge(t, "k-review", "pm_card_approve")
	id := chargeID(t, first)
	r := b.waitFor(t, id, "requires_review", 15*time.Second)
	wantEvents(t, r, "charge.processing", "charge.reversing", "charge.requires_review")
	if r.keyStatus != 0 || r.opState != "requires_review" {
		t.Errorf("rows %+v, want the key still bound", r)
	}
	if n := b.api.Cards.Stats.Reviews.Load(); n != 1 {
		t.Errorf("%d reviews counted, want 1", n)
	}
	// The key stays bound: a retry answers the charge as it stands.
	again := b.charge(t, "k-review", "pm_card_approve")
	if again.status != http.StatusAccepted || !bytes.Contains(again.body, []byte(`"status":"requires_review"`)) {
		t.Errorf("retry: %d %s, want 202 requires_review", again.status, again.body)
	}
	if a := b.audit(t, id); a.Approvals != 1 || a.Reversals != 0 {
		t.Errorf("audit %+v", a)
	}
}

func TestConcurrentRequestsWithOneKeyApproveOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 200 * time.Millisecond})
	const n = 50
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		answers = make([]answer, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = b.charge(t, "k-fifty", "pm_card_approve_lose_response")
		}()
	}
	close(start)
	wg.Wait()
	ids := map[string]bool{}
	for _, a := range answers {
		switch a.status {
		case http.StatusAccepted, http.StatusCreated:
			ids[chargeID(t, a)] = true
		case http.StatusConflict: // still in flight past IDEMPOTENCY_WAIT
		default:
			t.Fatalf("answer %d %s", a.status, a.body)
		}
	}
	if len(ids) != 1 {
		t.Fatalf("answers name %d charges, want 1: %v", len(ids), ids)
	}
	var id string
	for id = range ids {
	}
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	if r.charges != 1 || r.ops != 1 {
		t.Errorf("rows %+v, want one charge and one operation", r)
	}
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if a := b.audit(t, id); a.Approvals != 1 {
		t.Errorf("audit %+v, want exactly 1 approval", a)
	}
}

func TestBadInputIsRefusedBeforeTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	for _, body := range []string{
		`{"payment_method": "pm_card_approve", "account_id": "acct_00000000000000000000000000000000", "amount": 1, "currency": "EUR"}`,
		`{"amount": 1, "currency": "EUR"}`,
		`{"payment_method": "card_approve", "amount": 1, "currency": "EUR"}`,
		`{"payment_method": "pm_card approve", "amount": 1, "currency": "EUR"}`,
		`{"payment_method": "pm_` + strings.Repeat("a", 65) + `", "amount": 1, "currency": "EUR"}`,
		`{"payment_method": "pm_card_approve", "amount": 0, "currency": "EUR"}`,
	} {
		a := b.post(t, "/v1/charges", "k-bad", body)
		if a.status != http.StatusBadRequest || !bytes.Contains(a.body, []byte(`"code":"invalid-request"`)) {
			t.Errorf("%s: %d %s, want 400 invalid-request", body, a.status, a.body)
		}
	}
	var charges, keys int
	if err := b.api.DB.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1),
		(SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1)`, b.api.MerchantID).Scan(&charges, &keys); err != nil {
		t.Fatal(err)
	}
	if charges != 0 || keys != 0 {
		t.Errorf("%d charges and %d keys written, want none", charges, keys)
	}
}

func TestWithoutAProcessorNothingIsWritten(t *testing.T) {
	t.Parallel()
	api := testkit.StartAPI(t, pgtest.NewDatabase(t), testkit.APIOptions{Cards: &cards.Options{}})
	b := &bundle{api: api, client: http.DefaultClient}
	a := b.charge(t, "k-none", "pm_card_approve")
	if a.status != http.StatusBadRequest || !bytes.Contains(a.body, []byte(`"code":"no-card-processor"`)) ||
		!bytes.Contains(a.body, []byte("PROCESSOR")) {
		t.Fatalf("charge: %d %s, want 400 no-card-processor naming PROCESSOR", a.status, a.body)
	}
	var charges, keys int
	if err := api.DB.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1),
		(SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1)`, api.MerchantID).Scan(&charges, &keys); err != nil {
		t.Fatal(err)
	}
	if charges != 0 || keys != 0 {
		t.Errorf("%d charges and %d keys written, want none", charges, keys)
	}
}
