package procsim_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
)

// TestLookupAndReversal looks payments up by our reference and reverses them
// by it: whatever was done (an authorization, a partial capture, a refund)
// is given back once, however often the reversal is sent.
func TestLookupAndReversal(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	const ref = "ref_lookup"
	if r := s.must(http.MethodGet, "/v1/payments?reference="+ref, "", nil); r.status != http.StatusOK ||
		len(decode[procsim.LookupAnswer](t, r).Payments) != 0 {
		t.Fatalf("an unknown reference: got %d %s, want 200 and none", r.status, r.body)
	}
	noCapture := false
	a := decode[procsim.AuthorizeAnswer](t, s.authorize("k1", procsim.AuthorizeRequest{
		Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_approve", Reference: ref, Capture: &noCapture}))
	b := decode[procsim.AuthorizeAnswer](t, s.authorize("k2", auth(ref, "pm_card_approve", 300)))
	s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/captures", "k3", procsim.AmountRequest{Amount: 600})
	s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/refunds", "k4", procsim.AmountRequest{Amount: 100})
	if r := s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/refunds", "k5", procsim.AmountRequest{Amount: 501}); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("an over-refund: got %d %s", r.status, r.body)
	}

	found := decode[procsim.LookupAnswer](t, s.must(http.MethodGet, "/v1/payments?reference="+ref, "", nil))
	if len(found.Payments) != 2 || found.Payments[0].PSPReference != a.PSPReference || found.Payments[0].CapturedAmount != 600 ||
		found.Payments[0].RefundedAmount != 100 || found.Payments[1].PSPReference != b.PSPReference {
		t.Fatalf("lookup: %+v", found)
	}

	rev := s.must(http.MethodPost, "/v1/reversals", "rev1", procsim.ReversalRequest{Reference: ref})
	ra := decode[procsim.ReversalAnswer](t, rev)
	if rev.status != http.StatusOK || len(ra.Payments) != 2 || ra.Payments[0].Status != procsim.StatusReversed || ra.Payments[1].Status != procsim.StatusReversed {
		t.Fatalf("reversal: %d %s", rev.status, rev.body)
	}
	// Another key reverses nothing more; a capture after it is refused.
	if r := s.must(http.MethodPost, "/v1/reversals", "rev2", procsim.ReversalRequest{Reference: ref}); r.status != http.StatusOK {
		t.Fatalf("second reversal: %d %s", r.status, r.body)
	}
	if r := s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/captures", "k6", procsim.AmountRequest{}); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("a capture after the reversal: %d %s", r.status, r.body)
	}
	// a: 1000 approved, 600 captured, 100 refunded: 900 given back by the
	// reversal (400 voided, 500 refunded); b: 300 captured, 300 given back.
	wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 2, ApprovedAmount: 1300, Captures: 2, CapturedAmount: 900,
		Refunds: 1, RefundedAmount: 100, Reversals: 2, ReversedAmount: 1200})
	// A reversal of a reference never seen is accepted, and does nothing.
	if r := s.must(http.MethodPost, "/v1/reversals", "rev3", procsim.ReversalRequest{Reference: "ref_never"}); r.status != http.StatusOK {
		t.Fatalf("reversal of an unknown reference: %d %s", r.status, r.body)
	}
}

// TestVoid voids an authorization once, and refuses it after a capture.
func TestVoid(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	noCapture := false
	req := procsim.AuthorizeRequest{Amount: 400, Currency: "EUR", PaymentMethod: "pm_card_approve", Reference: "ref_void", Capture: &noCapture}
	a := decode[procsim.AuthorizeAnswer](t, s.authorize("v1", req))
	if r := s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/voids", "v2", nil); r.status != http.StatusOK ||
		decode[procsim.Payment](t, r).Status != procsim.StatusVoided {
		t.Fatalf("void: %d %s", r.status, r.body)
	}
	if r := s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/voids", "v3", nil); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("second void: %d %s", r.status, r.body)
	}
	if r := s.must(http.MethodGet, "/v1/payments/psp_nope", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("unknown psp reference: %d %s", r.status, r.body)
	}
	wantAudit(t, s, "ref_void", procsim.AuditCounts{Approvals: 1, ApprovedAmount: 400, Voids: 1})
}

// TestDecisionDeadline: an approval whose answer was lost is cancelled by the
// simulator after the deadline; one answered, or found by a lookup before
// the deadline, is kept.
func TestDecisionDeadline(t *testing.T) {
	t.Parallel()
	s := startSim(t, "-decision-deadline", "2s")
	lose := func(ref string) {
		if _, err := s.do(client(5*time.Second), http.MethodPost, "/v1/authorizations", ref, auth(ref, "pm_card_approve_lose_response", 100)); err == nil {
			t.Fatal("the answer was not lost")
		}
	}
	lose("ref_lost")
	lose("ref_found")
	// A caller that gives up before the late answer was not answered either.
	if _, err := s.do(client(300*time.Millisecond), http.MethodPost, "/v1/authorizations", "ref_late",
		auth("ref_late", "pm_card_approve_answer_late", 100)); err == nil {
		t.Fatal("the late answer came in time")
	}
	s.must(http.MethodGet, "/v1/payments?reference=ref_found", "", nil)
	s.authorize("ref_answered", auth("ref_answered", "pm_card_approve", 100))

	for _, ref := range []string{"ref_lost", "ref_late"} {
		eventually(t, 10*time.Second, ref+": the unanswered approval expires", func() bool { return s.audit(ref).Expiries == 1 })
		wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 100, Captures: 1, CapturedAmount: 100,
			Expiries: 1, ExpiredAmount: 100})
	}
	for _, ref := range []string{"ref_found", "ref_answered"} {
		wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 100, Captures: 1, CapturedAmount: 100})
	}
	found := decode[procsim.LookupAnswer](t, s.must(http.MethodGet, "/v1/payments?reference=ref_lost", "", nil))
	if len(found.Payments) != 1 || found.Payments[0].Status != procsim.StatusExpired {
		t.Fatalf("lookup after the deadline: %+v", found)
	}
}
