package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestCardChargesFollowTheSpec: every answer of a card charge, through the
// fixture's contract check, is one openapi.yaml documents: the 201 and its
// replay, the 402 card-declined with its decline_code, the 202 of a charge
// answered late (Location, Retry-After), the charge read while processing
// and once recovered, the 202 of a retry while it is processing and the 402
// card-charge-failed once the processor's deadline passed without a record,
// the 409 of a capture, the 400 of an unsigned processor event, and the 400
// of a charge naming both an account and a card. Each is checked for the money as well: the
// charge's status, and the processor's approvals in its audit.
func TestCardChargesFollowTheSpec(t *testing.T) {
	t.Parallel()
	sim := procsimtest.Start(t, "-decision-deadline", "4s")
	// Keep-alives off: Go's client would resend a request whose reused
	// connection closed before its answer, and a lost answer would come
	// back as the approval.
	f := setup(t, func(o *setupOptions) {
		o.cards = &cards.Options{
			Processor: processor.NewSimulator(sim.URL(), &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}),
			Wait:      time.Second, KeyWait: 300 * time.Millisecond, CallTimeout: 2 * time.Second, DecisionDeadline: 4 * time.Second,
			Interval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
			WebhookSecret: "spec-secret",
		}
	})
	charge := func(method string) string {
		return `{"payment_method":"` + method + `","amount":2500,"currency":"EUR"}`
	}

	approved := f.post("/v1/charges", "card-approve", charge("pm_card_approve"))
	again := f.post("/v1/charges", "card-approve", charge("pm_card_approve"))
	if approved.status != http.StatusCreated || again.status != http.StatusCreated || string(again.body) != string(approved.body) ||
		again.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(approved.body), `"status":"succeeded"`) {
		t.Fatalf("approve: %d %s, then %d %s; want 201 succeeded, replayed byte for byte", approved.status, approved.body, again.status, again.body)
	}
	id := idOf(t, approved.body)
	if r := f.post("/v1/charges/"+id+"/capture", "card-capture", `{}`); r.status != http.StatusConflict {
		t.Errorf("capture of a card charge: %d %s, want 409", r.status, r.body)
	}

	declined := f.post("/v1/charges", "card-decline", charge("pm_card_decline_do_not_honor"))
	if declined.status != http.StatusPaymentRequired || !strings.Contains(string(declined.body), `"code":"card-declined"`) ||
		!strings.Contains(string(declined.body), `"decline_code":"do_not_honor"`) {
		t.Errorf("decline: %d %s, want 402 card-declined with decline_code do_not_honor", declined.status, declined.body)
	}

	late := f.post("/v1/charges", "card-late", charge("pm_card_approve_answer_late"))
	if late.status != http.StatusAccepted || late.header.Get("Retry-After") == "" ||
		!strings.HasPrefix(late.header.Get("Location"), "/v1/charges/ch_") || !strings.Contains(string(late.body), `"status":"processing"`) {
		t.Fatalf("late answer: %d %v %s, want 202 processing with Location and Retry-After", late.status, late.header, late.body)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := f.get(late.header.Get("Location"))
		if strings.Contains(string(r.body), `"status":"succeeded"`) {
			break
		}
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":"processing"`) || time.Now().After(deadline) {
			t.Fatalf("the late answer's charge: %d %s, want processing until recovery finds the approval", r.status, r.body)
		}
	}
	final := f.post("/v1/charges", "card-late", charge("pm_card_approve_answer_late"))
	if final.status != http.StatusCreated || final.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry once recovered: %d %s, want the 201 replayed", final.status, final.body)
	}

	never := f.post("/v1/charges", "card-never", charge("pm_card_5xx_before"))
	retry := f.post("/v1/charges", "card-never", charge("pm_card_5xx_before"))
	if never.status != http.StatusAccepted || retry.status != http.StatusAccepted || retry.header.Get("Idempotent-Replayed") != "true" ||
		!strings.Contains(string(retry.body), `"status":"processing"`) {
		t.Fatalf("a charge the processor fails before processing, and its retry: %d %s, then %d %v %s; want 202 processing twice",
			never.status, never.body, retry.status, retry.header, retry.body)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := f.post("/v1/charges", "card-never", charge("pm_card_5xx_before"))
		if r.status == http.StatusPaymentRequired {
			if !strings.Contains(string(r.body), `"code":"card-charge-failed"`) || r.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("past the deadline: %d %s, want 402 card-charge-failed replayed", r.status, r.body)
			}
			break
		}
		if r.status != http.StatusAccepted || time.Now().After(deadline) {
			t.Fatalf("retry before the deadline: %d %s, want 202 until the charge fails", r.status, r.body)
		}
	}

	unsigned, err := http.NewRequest(http.MethodPost, f.url+"/v1/processor/events", strings.NewReader(`{"id":"evt_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	unsigned.Header.Set("Content-Type", "application/json")
	unsigned.Header.Set("Procsim-Signature", "t=1,v1=00")
	if r := f.do(unsigned); r.status != http.StatusBadRequest {
		t.Errorf("unsigned processor event: %d %s, want 400", r.status, r.body)
	}
	both := `{"account_id":"acct_4a5f3df99a5d518c03adf918c80d03ef","payment_method":"pm_card_approve","amount":1,"currency":"EUR"}`
	if r := f.post("/v1/charges", "card-both", both); r.status != http.StatusBadRequest {
		t.Errorf("a charge naming an account and a card: %d %s, want 400", r.status, r.body)
	}

	approvals := 0
	for _, r := range sim.Audit(t).References {
		approvals += r.Approvals
	}
	if approvals != 2 {
		t.Errorf("the simulator approved %d times, want 2 (the approval and the late answer, each once)", approvals)
	}
}

// idOf returns the id of the object in body.
func idOf(t *testing.T, body []byte) string {
	t.Helper()
	var v struct{ ID string }
	if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
		t.Fatalf("no id in %s (%v)", body, err)
	}
	return v.ID
}
