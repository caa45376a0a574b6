package processor_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/procsim"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

func TestMain(m *testing.M) { procsimtest.Main(m) }

// newAdapter returns the adapter for sim, opening a connection per request
// so that a dropped answer is seen as one.
func newAdapter(sim *procsimtest.Sim, timeout time.Duration) *processor.Simulator {
	return processor.NewSimulator(sim.URL(), &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}})
}

func authorization(ref, method string, capture bool) processor.Authorization {
	return processor.Authorization{Key: "pk_" + ref, Reference: ref, Amount: 1000, Currency: "EUR", PaymentMethod: method, Capture: capture}
}

// audit reads what the simulator did under ref.
func audit(t *testing.T, sim *procsimtest.Sim, ref string) procsim.AuditCounts {
	t.Helper()
	resp, err := http.Get(sim.URL() + "/v1/audit?reference=" + ref)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a procsim.Audit
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("audit: %v: %s", err, b)
	}
	if len(a.References) == 0 {
		return procsim.AuditCounts{}
	}
	return a.References[0].AuditCounts
}

func want(t *testing.T, r processor.Result, outcome processor.Outcome, code string) {
	t.Helper()
	if r.Outcome != outcome || r.Code != code {
		t.Fatalf("got %s %q (err %v), want %s %q", r.Outcome, r.Code, r.Err, outcome, code)
	}
}

// TestOutcomes runs every outcome through the real simulator.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	sim := procsimtest.Start(t)
	p := newAdapter(sim, 5*time.Second)
	ctx := t.Context()

	auth := p.Authorize(ctx, authorization("ref_auth", "pm_card_approve", false))
	want(t, auth, processor.Approved, "")
	if auth.Payment.Status != "authorized" || auth.Payment.PSPReference == "" {
		t.Fatalf("authorization: %+v", auth.Payment)
	}
	want(t, p.Capture(ctx, "cap_1", auth.Payment.PSPReference, 600), processor.Approved, "")
	want(t, p.Refund(ctx, "ref_1", auth.Payment.PSPReference, 0), processor.Approved, "")
	want(t, p.Refund(ctx, "ref_2", auth.Payment.PSPReference, 1), processor.Declined, "invalid_state")

	other := p.Authorize(ctx, authorization("ref_void", "pm_card_approve", false))
	want(t, p.Void(ctx, "void_1", other.Payment.PSPReference), processor.Approved, "")

	want(t, p.Authorize(ctx, authorization("ref_nsf", "pm_card_decline_insufficient_funds", true)), processor.Declined, "insufficient_funds")
	want(t, p.Authorize(ctx, authorization("ref_dnh", "pm_card_decline_do_not_honor", true)), processor.Declined, "do_not_honor")
	want(t, p.Authorize(ctx, authorization("ref_async", "pm_card_async_pending", true)), processor.Pending, "")
	want(t, p.Authorize(ctx, authorization("ref_5xx", "pm_card_5xx_before", true)), processor.Unknown, "internal")
	want(t, p.Authorize(ctx, authorization("ref_bad", "pm_card_nonexistent", true)), processor.Declined, "unknown_payment_method")

	want(t, p.Authorize(ctx, authorization("ref_refused", "pm_card_reversal_refused_3", true)), processor.Approved, "")
	for range 3 {
		want(t, p.Reverse(ctx, "rev_refused", "ref_refused"), processor.Unknown, "reversal_refused")
	}
	rev := p.Reverse(ctx, "rev_refused", "ref_refused")
	want(t, rev, processor.Approved, "")
	if len(rev.Payments) != 1 || rev.Payments[0].Status != "reversed" {
		t.Fatalf("reversal: %+v", rev.Payments)
	}
}

// TestLostAnswerIsUnknown: an approval whose answer is lost, late or a 500
// is Unknown, and a later lookup by our reference finds it; a same-key retry
// gets it too, and the processor approved once.
func TestLostAnswerIsUnknown(t *testing.T) {
	t.Parallel()
	sim := procsimtest.Start(t)
	cases := []struct{ method, code string }{
		{"pm_card_approve_lose_response", "connection"},
		{"pm_card_approve_answer_late", "timeout"},
		{"pm_card_5xx_after", "internal"},
	}
	for _, c := range cases {
		t.Run(c.method, func(t *testing.T) {
			t.Parallel()
			p := newAdapter(sim, 500*time.Millisecond)
			a := authorization("ref_"+c.method, c.method, true)
			want(t, p.Authorize(t.Context(), a), processor.Unknown, c.code)
			found, err := p.Lookup(t.Context(), a.Reference)
			if err != nil || len(found) != 1 || found[0].Status != "captured" || found[0].ApprovedAmount != 1000 {
				t.Fatalf("lookup: %+v, %v", found, err)
			}
			again := p.Authorize(t.Context(), a)
			want(t, again, processor.Approved, "")
			if again.Payment.PSPReference != found[0].PSPReference {
				t.Fatalf("the retry answered %s, the lookup found %s", again.Payment.PSPReference, found[0].PSPReference)
			}
			if got := audit(t, sim, a.Reference); got.Approvals != 1 {
				t.Fatalf("approvals: %d, want 1", got.Approvals)
			}
		})
	}
}

// TestNotSentIsRetried: while nothing listens, the request is never written;
// the adapter tries again with the same key until the simulator is back, and
// the processor approves once.
func TestNotSentIsRetried(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sim := procsimtest.Start(t, "-addr", addr)
	sim.Kill()
	p := newAdapter(sim, 5*time.Second)
	p.Attempts, p.Backoff = 8, 100*time.Millisecond

	done := make(chan processor.Result, 1)
	go func() {
		done <- p.Authorize(context.Background(), authorization("ref_notsent", "pm_card_approve", true))
	}()
	time.Sleep(300 * time.Millisecond)
	sim.Restart()
	want(t, <-done, processor.Approved, "")
	if got := audit(t, sim, "ref_notsent"); got.Approvals != 1 {
		t.Fatalf("approvals: %d, want 1", got.Approvals)
	}

	// With the simulator gone for good, the attempts run out: Unknown.
	sim.Kill()
	p.Attempts, p.Backoff = 2, 10*time.Millisecond
	r := p.Authorize(t.Context(), authorization("ref_gone", "pm_card_approve", true))
	want(t, r, processor.Unknown, "not_sent")
	if _, err := p.Lookup(t.Context(), "ref_gone"); !errors.Is(err, processor.ErrUnknown) {
		t.Fatalf("lookup with the simulator gone: %v", err)
	}
}
