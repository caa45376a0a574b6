package cards_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
)

// An operation belongs to the processor it was sent to. Two services on one
// database, each configured for a simulator of its own (a deployment whose
// PROCESSOR_URL changed, or two in one test package): the other's recovery
// never looks up, re-drives or reverses it, which would charge the card a
// second time at a processor that never had it, and the other's capture of
// a charge authorized elsewhere is refused, writing nothing.

func TestOperationsStayWithTheirProcessor(t *testing.T) {
	t.Parallel()
	// a's recovery runs once at its start, then not for an hour: only b's
	// looks at the operations while the test watches.
	a := setup(t, cards.Options{Wait: 50 * time.Millisecond, Interval: time.Hour})
	b := setupOn(t, a.dbURL, cards.Options{})

	a.proxy.loseAuthorizations.Store(true)
	lost := a.charge(t, "k-lost", "pm_card_approve")
	if lost.status != http.StatusAccepted {
		t.Fatalf("charge whose answer is lost: %d %s, want 202", lost.status, lost.body)
	}
	id := chargeID(t, lost)
	a.proxy.loseAuthorizations.Store(false)
	// Its next check is 100 ms after the lost answer; b's recovery claims
	// due operations every 50 ms.
	time.Sleep(2 * time.Second)
	if r := a.rowsOf(t, id); r.status != "processing" || r.opState != "processing" {
		t.Errorf("with only another processor's recovery running: %+v, want the charge left processing", r)
	}
	if got := b.audit(t, id); got.found {
		t.Errorf("the other simulator's audit of %s: %+v, want no record (no lookup turns into a re-drive there)", id, got)
	}
	if n := b.api.Cards.Stats.Lookups.Load() + b.api.Cards.Stats.Redrives.Load(); n != 0 {
		t.Errorf("the other service looked up or re-drove %d times, want 0", n)
	}
	// Its own processor's recovery resolves it from the approval there.
	if _, err := a.api.Cards.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := a.waitFor(t, id, "succeeded", 5*time.Second); r.opState != "succeeded" {
		t.Errorf("after its own recovery: %+v", r)
	}
	if got := a.audit(t, id); got.Approvals != 1 {
		t.Errorf("its simulator's audit: %+v, want the one approval", got)
	}

	// A capture asked of the other service is refused, and nothing is
	// written under its key: the same request to the charge's own service
	// then captures it.
	auth := a.settled(t, "/v1/charges", "k-auth", `{"payment_method": "pm_card_approve", "amount": 700, "currency": "EUR", "capture": false}`)
	authID := chargeID(t, auth)
	req, err := http.NewRequest(http.MethodPost, b.api.URL+"/v1/charges/"+authID+"/capture", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.api.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-capture")
	if r := a.do(t, req); r.status != http.StatusServiceUnavailable || !bytes.Contains(r.body, []byte(`"code":"processor-not-configured"`)) {
		t.Errorf("capture at the other processor's service: %d %s, want 503 processor-not-configured", r.status, r.body)
	}
	if l := a.ledgerOf(t, authID); l.status != "authorized" || len(l.ops) != 1 || l.boundKeys != 0 || l.answeredKeys != 2 {
		t.Errorf("after the refused capture: %+v, want the authorization alone, and no key but the two charges'", l)
	}
	var keys int
	if err := a.api.DB.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1`, a.api.MerchantID).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != 2 {
		t.Errorf("%d keys stored, want 2 (the charges'; none for the refused capture)", keys)
	}
	if got := b.audit(t, authID); got.found {
		t.Errorf("the other simulator's audit of %s: %+v, want no record", authID, got)
	}
	if r := a.settled(t, "/v1/charges/"+authID+"/capture", "k-capture", `{}`); r.status != http.StatusOK ||
		!bytes.Contains(r.body, []byte(`"amount_captured":700`)) {
		t.Errorf("the same capture at the charge's own service: %d %s, want 200 captured", r.status, r.body)
	}
	if got := a.audit(t, authID); got.Captures != 1 || got.CapturedAmount != 700 {
		t.Errorf("its simulator's audit: %+v, want 1 capture of 700", got)
	}
}
