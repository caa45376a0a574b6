package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
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
	// A decision deadline well past the late answer's recovery (its call
	// gives up after 2 s, and a lookup follows), so that a loaded machine
	// does not let the simulator cancel the approval first.
	sim := procsimtest.Start(t, "-decision-deadline", "8s")
	// Keep-alives off: Go's client would resend a request whose reused
	// connection closed before its answer, and a lost answer would come
	// back as the approval.
	f := setup(t, func(o *setupOptions) {
		o.cards = &cards.Options{
			Processor: processor.NewSimulator(sim.URL(), &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}),
			Wait:      time.Second, KeyWait: 300 * time.Millisecond, CallTimeout: 2 * time.Second, DecisionDeadline: 8 * time.Second,
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

// TestCardOperationsFollowTheSpec: every answer of a card charge's capture,
// void and refund, through the fixture's contract check, is one openapi.yaml
// documents: the 200 of a capture and of a void, the 201 of a refund, their
// 202 when the processor answers after the wait (the charge as it stands,
// the refund pending) and the final answer replayed to a retry, the 409 of a
// capture or void while another is in flight, the processor's refusal (409
// processor-declined), and the refusals decided before the call. Each is
// checked for the money: the charge's amounts, and the processor's captures,
// voids and refunds in its audit.
func TestCardOperationsFollowTheSpec(t *testing.T) {
	t.Parallel()
	sim := procsimtest.Start(t, "-decision-deadline", "10s")
	// slow delays the processor's captures, voids and refunds past the
	// request's wait while it is set.
	var slow atomic.Bool
	target, _ := url.Parse(sim.URL())
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() && r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/payments/") {
			time.Sleep(1500 * time.Millisecond)
		}
		httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	f := setup(t, func(o *setupOptions) {
		o.cards = &cards.Options{
			Processor: processor.NewSimulator(proxy.URL, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}),
			Wait:      time.Second, KeyWait: 3 * time.Second, CallTimeout: 4 * time.Second, DecisionDeadline: 10 * time.Second,
			Interval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
		}
	})
	authorize := func(key string) string {
		r := f.post("/v1/charges", key, `{"payment_method":"pm_card_approve","amount":2500,"currency":"EUR","capture":false}`)
		if r.status != http.StatusCreated {
			t.Fatalf("authorization: %d %s", r.status, r.body)
		}
		return idOf(t, r.body)
	}
	// later sends body under key while the processor is slow: 202, then,
	// once the operation ended, the final answer replayed.
	later := func(path, key, body string, status int, want string) reply {
		t.Helper()
		slow.Store(true)
		first := f.post(path, key, body)
		slow.Store(false)
		if first.status != http.StatusAccepted || first.header.Get("Retry-After") == "" || first.header.Get("Location") == "" {
			t.Fatalf("%s: %d %v %s, want 202 with Location and Retry-After", path, first.status, first.header, first.body)
		}
		final := f.post(path, key, body)
		if final.status != status || final.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(final.body), want) {
			t.Fatalf("%s retried: %d %s, want %d with %s replayed", path, final.status, final.body, status, want)
		}
		return first
	}

	id := authorize("auth-1")
	first := later("/v1/charges/"+id+"/capture", "capture-1", `{"amount":2000}`, http.StatusOK, `"amount_captured":2000`)
	if !strings.Contains(string(first.body), `"status":"authorized"`) {
		t.Errorf("the capture's 202: %s, want the charge still authorized", first.body)
	}
	if r := f.post("/v1/charges/"+id+"/void", "void-1", `{}`); r.status != http.StatusConflict || r.code(t) != "charge-not-voidable" {
		t.Errorf("void of a captured card charge: %d %s, want 409 charge-not-voidable", r.status, r.body)
	}
	refund := later("/v1/charges/"+id+"/refunds", "refund-1", `{"amount":500}`, http.StatusCreated, `"status":"succeeded"`)
	if !strings.Contains(string(refund.body), `"status":"pending"`) {
		t.Errorf("the refund's 202: %s, want it pending", refund.body)
	}
	if r := f.get(refund.header.Get("Location")); r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":"succeeded"`) {
		t.Errorf("the refund read: %d %s, want it succeeded", r.status, r.body)
	}
	if r := f.post("/v1/charges/"+id+"/refunds", "refund-2", `{}`); r.status != http.StatusCreated || !strings.Contains(string(r.body), `"amount":1500`) {
		t.Errorf("refund of the rest: %d %s, want 201 of 1500", r.status, r.body)
	}
	if r := f.post("/v1/charges/"+id+"/refunds", "refund-3", `{"amount":1}`); r.status != http.StatusUnprocessableEntity || r.code(t) != "refund-exceeds-charge" {
		t.Errorf("refund past the charge: %d %s, want 422 refund-exceeds-charge", r.status, r.body)
	}
	if r := f.get("/v1/charges/" + id); !strings.Contains(string(r.body), `"amount_refunded":2000`) {
		t.Errorf("the charge: %s, want amount_refunded 2000", r.body)
	}

	voided := authorize("auth-2")
	later("/v1/charges/"+voided+"/void", "void-2", `{}`, http.StatusOK, `"status":"voided"`)

	busy := authorize("auth-3")
	slow.Store(true)
	if r := f.post("/v1/charges/"+busy+"/capture", "capture-3", `{}`); r.status != http.StatusAccepted {
		t.Fatalf("capture: %d %s, want 202", r.status, r.body)
	}
	slow.Store(false)
	if r := f.post("/v1/charges/"+busy+"/void", "void-3", `{}`); r.status != http.StatusConflict || r.code(t) != "charge-operation-in-progress" {
		t.Errorf("void while a capture is in flight: %d %s, want 409 charge-operation-in-progress", r.status, r.body)
	}
	if r := f.post("/v1/charges/"+busy+"/capture", "capture-3", `{}`); r.status != http.StatusOK {
		t.Errorf("capture retried: %d %s, want its 200", r.status, r.body)
	}
	// Refused by the processor: the charge was voided there behind the
	// service's back.
	refused := authorize("auth-4")
	var psp string
	if err := f.db.QueryRow(t.Context(), `SELECT psp_reference FROM charges WHERE psp_reference IS NOT NULL AND merchant_id = $1
		ORDER BY seq DESC LIMIT 1`, f.merchantID).Scan(&psp); err != nil {
		t.Fatal(err)
	}
	behind, _ := http.NewRequest(http.MethodPost, sim.URL()+"/v1/payments/"+psp+"/voids", strings.NewReader(`{}`))
	behind.Header.Set("Idempotency-Key", "behind")
	if resp, err := http.DefaultClient.Do(behind); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("void at the simulator: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if r := f.post("/v1/charges/"+refused+"/capture", "capture-4", `{}`); r.status != http.StatusConflict || r.code(t) != "processor-declined" {
		t.Errorf("capture the processor refuses: %d %s, want 409 processor-declined", r.status, r.body)
	}

	var captures, voids, refunds int
	audit := sim.Audit(t)
	for _, r := range audit.References {
		captures, voids, refunds = captures+r.Captures, voids+r.Voids, refunds+r.Refunds
	}
	if captures != 2 || voids != 2 || refunds != 2 {
		t.Errorf("the simulator did %d captures, %d voids, %d refunds; want 2 (2000 and busy's), 2 (the service's and the one behind it), 2",
			captures, voids, refunds)
		// What each reference had done, to tell a capture done twice from
		// a count of another kind (it failed once under load).
		for _, r := range audit.References {
			t.Logf("reference %s: %+v", r.Reference, r.AuditCounts)
		}
	}
}
