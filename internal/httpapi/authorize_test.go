package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/postgres"
)

// Authorize now, capture later, over HTTP: the hold, the capture of part of
// it, the refusals of what is no longer authorized, and the money at each
// step.

// authorize creates an authorization of amount on acct and returns its id.
func (f *fixture) authorize(acct string, amount int64) string {
	f.t.Helper()
	r := f.post("/v1/charges", uuid.NewString(), fmt.Sprintf(`{"account_id":%q,"amount":%d,"currency":"USD","capture":false}`, acct, amount))
	if r.status != http.StatusCreated {
		f.t.Fatalf("authorize %d: %d %s", amount, r.status, r.body)
	}
	c := r.json(f.t)
	if c["status"] != "authorized" || c["amount_captured"] != 0.0 || c["expires_at"] == nil {
		f.t.Fatalf("authorization: %s", r.body)
	}
	return c["id"].(string)
}

// money reads an account's balance and available over the API.
func (f *fixture) money(acct string) (balance, available int64) {
	f.t.Helper()
	a := f.get("/v1/accounts/" + acct).json(f.t)
	return int64(a["balance"].(float64)), int64(a["available"].(float64))
}

func (f *fixture) wantMoney(acct string, balance, available int64) {
	f.t.Helper()
	if b, a := f.money(acct); b != balance || a != available {
		f.t.Errorf("balance %d, available %d; want %d, %d", b, a, balance, available)
	}
	f.checkLedger(acct)
}

// wantRefused checks a problem's status, code and charge_status.
func wantRefused(t *testing.T, r reply, status int, code, chargeStatus string) {
	t.Helper()
	if r.status != status || r.code(t) != code {
		t.Fatalf("got %d %s, want %d %s", r.status, r.body, status, code)
	}
	if got, _ := r.json(t)["charge_status"].(string); got != chargeStatus {
		t.Errorf("charge_status %q, want %q: %s", got, chargeStatus, r.body)
	}
}

// events counts the merchant's events of a type about a charge.
func (f *fixture) events(eventType, chargeID string) int {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = $2 AND payload->>'id' = $3`, eventType, chargeID)
}

func TestAuthorizeHoldsAndCaptureTakesPart(t *testing.T) {
	f := setup(t)
	acct := f.account("USD", 1000)
	ch := f.authorize(acct, 600)
	f.wantMoney(acct, 1000, 400)

	// The hold is not spendable: a plain charge sees only what is available.
	r := f.post("/v1/charges", uuid.NewString(), fmt.Sprintf(`{"account_id":%q,"amount":500,"currency":"USD"}`, acct))
	wantRefused(t, r, http.StatusPaymentRequired, "insufficient-funds", "")
	f.wantMoney(acct, 1000, 400)

	// More than authorized: refused, stored, nothing moves.
	over := uuid.NewString()
	r = f.post("/v1/charges/"+ch+"/capture", over, `{"amount":601}`)
	wantRefused(t, r, http.StatusUnprocessableEntity, "capture-exceeds-authorization", "")
	if again := f.post("/v1/charges/"+ch+"/capture", over, `{"amount":601}`); !bytes.Equal(again.body, r.body) {
		t.Errorf("the refusal's replay differs:\n%s\n%s", again.body, r.body)
	}
	f.wantMoney(acct, 1000, 400)

	key := uuid.NewString()
	r = f.post("/v1/charges/"+ch+"/capture", key, `{"amount":250}`)
	if r.status != http.StatusOK {
		t.Fatalf("capture: %d %s", r.status, r.body)
	}
	c := r.json(t)
	if c["status"] != "succeeded" || c["amount_captured"] != 250.0 || c["amount"] != 600.0 || r.header.Get("Location") != "" {
		t.Errorf("captured charge: %s (Location %q)", r.body, r.header.Get("Location"))
	}
	f.wantMoney(acct, 750, 750) // 250 taken, the other 350 of the hold released

	// The retry replays the same bytes and takes nothing more.
	again := f.post("/v1/charges/"+ch+"/capture", key, `{"amount":250}`)
	if again.status != http.StatusOK || !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %s (replayed %q)", again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	f.wantMoney(acct, 750, 750)

	// Captured: no second capture, no void; refunds only of what was captured.
	wantRefused(t, f.post("/v1/charges/"+ch+"/capture", uuid.NewString(), ""), http.StatusConflict, "charge-not-capturable", "succeeded")
	wantRefused(t, f.post("/v1/charges/"+ch+"/void", uuid.NewString(), ""), http.StatusConflict, "charge-not-voidable", "succeeded")
	wantRefused(t, f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), `{"amount":251}`), http.StatusUnprocessableEntity, "refund-exceeds-charge", "")
	if r := f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), `{}`); r.status != http.StatusCreated || r.json(t)["amount"] != 250.0 {
		t.Fatalf("refund of the rest: %d %s", r.status, r.body)
	}
	f.wantMoney(acct, 1000, 1000)
	if got := f.get("/v1/charges/" + ch).json(t); got["amount_refunded"] != 250.0 || got["status"] != "succeeded" {
		t.Errorf("charge after the refund: %v", got)
	}
	for typ, want := range map[string]int{"charge.authorized": 1, "charge.captured": 1, "charge.voided": 0, "charge.expired": 0} {
		if n := f.events(typ, ch); n != want {
			t.Errorf("%d %s events, want %d", n, typ, want)
		}
	}
}

func TestVoidReleasesTheHold(t *testing.T) {
	f := setup(t)
	acct := f.account("USD", 1000)
	ch := f.authorize(acct, 1000)
	f.wantMoney(acct, 1000, 0)
	// An authorization the available funds do not cover is a stored 402.
	r := f.post("/v1/charges", uuid.NewString(), fmt.Sprintf(`{"account_id":%q,"amount":1,"currency":"USD","capture":false}`, acct))
	wantRefused(t, r, http.StatusPaymentRequired, "insufficient-funds", "")

	// Both forms of an empty body: none at all, and {}.
	r = f.post("/v1/charges/"+ch+"/void", uuid.NewString(), "")
	if r.status != http.StatusOK || r.json(t)["status"] != "voided" || r.json(t)["amount_captured"] != 0.0 {
		t.Fatalf("void: %d %s", r.status, r.body)
	}
	f.wantMoney(acct, 1000, 1000)
	wantRefused(t, f.post("/v1/charges/"+ch+"/void", uuid.NewString(), "{}"), http.StatusConflict, "charge-not-voidable", "voided")
	wantRefused(t, f.post("/v1/charges/"+ch+"/capture", uuid.NewString(), "{}"), http.StatusConflict, "charge-not-capturable", "voided")
	wantRefused(t, f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), "{}"), http.StatusConflict, "charge-not-refundable", "")
	if got := f.get("/v1/charges/" + ch).json(t); got["status"] != "voided" {
		t.Errorf("charge after the void: %v", got)
	}
	if n := f.events("charge.voided", ch); n != 1 {
		t.Errorf("%d charge.voided events, want 1", n)
	}

	// Unknown charges, and another merchant's, are 404 and stored.
	other := f.otherMerchant()
	wantRefused(t, other.post("/v1/charges/"+ch+"/void", uuid.NewString(), ""), http.StatusNotFound, "not-found", "")
	wantRefused(t, f.post("/v1/charges/ch_nope/capture", uuid.NewString(), ""), http.StatusNotFound, "not-found", "")
}

// TestExpiredHoldIsExpiredAtOnce: an authorization with a 2 s hold, read 3 s
// later with no sweep run (the test's service runs none), is expired
// everywhere; the sweep then records it once.
func TestExpiredHoldIsExpiredAtOnce(t *testing.T) {
	f := setup(t, func(o *setupOptions) { o.holdFor = 2 * time.Second })
	acct := f.account("USD", 1000)
	ch := f.authorize(acct, 700)
	f.wantMoney(acct, 1000, 300)
	time.Sleep(3 * time.Second)

	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'authorized'`); n != 1 {
		t.Fatalf("%d authorizations stored as authorized; the test needs the sweep not to have run", n)
	}
	if got := f.get("/v1/charges/" + ch).json(t); got["status"] != "expired" || got["amount_captured"] != 0.0 {
		t.Errorf("charge read after expiry: %v", got)
	}
	if page := f.get("/v1/charges?account_id=" + acct).json(t); page["data"].([]any)[0].(map[string]any)["status"] != "expired" {
		t.Errorf("charge list after expiry: %v", page)
	}
	f.wantMoney(acct, 1000, 1000)
	wantRefused(t, f.post("/v1/charges/"+ch+"/capture", uuid.NewString(), ""), http.StatusConflict, "charge-not-capturable", "expired")
	wantRefused(t, f.post("/v1/charges/"+ch+"/void", uuid.NewString(), ""), http.StatusConflict, "charge-not-voidable", "expired")
	// The expired hold's funds are spendable: a new authorization of all of it.
	ch2 := f.authorize(acct, 1000)
	f.wantMoney(acct, 1000, 0)

	holds := postgres.NewHolds(f.store.DB)
	n, ran, err := holds.ExpireHolds(context.Background(), 100)
	if err != nil || !ran || n < 1 {
		t.Fatalf("sweep: %d expired, ran %t, %v", n, ran, err)
	}
	if _, _, err := holds.ExpireHolds(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	if n := f.events("charge.expired", ch); n != 1 {
		t.Errorf("%d charge.expired events, want 1", n)
	}
	if n := f.events("charge.expired", ch2); n != 0 {
		t.Errorf("the live authorization got %d charge.expired events", n)
	}
	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'expired' AND id IN
        (SELECT aggregate_id FROM events WHERE merchant_id = $1 AND type = 'charge.expired')`); n != 1 {
		t.Errorf("%d charges stored expired with their event, want 1", n)
	}
	if n := f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1 AND held = 1000`); n != 1 {
		t.Errorf("the account's held is not the live hold's 1000 after the sweep")
	}
	f.wantMoney(acct, 1000, 0)
}
