package stripeproc_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/processor/stripeproc"
	"github.com/exactlyonce/payments/internal/testkit/stripefake"
)

func connect(t *testing.T, fake *stripefake.Server, retries int) *stripeproc.Stripe {
	t.Helper()
	s, err := stripeproc.New(context.Background(), stripeproc.Config{APIKey: "sk_test_123", APIBase: fake.URL,
		Account: "acct_fake", MaxNetworkRetries: retries,
		HTTPClient: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func authorization(ref, pm string, amount int64) processor.Authorization {
	return processor.Authorization{Key: ref + ":authorize", Reference: ref, Amount: amount, Currency: "EUR",
		PaymentMethod: pm, Capture: true}
}

// Every answer is classified as the port says: only a card's refusal and a
// request Stripe refused are final.
func TestAnswersAreClassified(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fault   stripefake.Fault
		pm      string
		outcome processor.Outcome
		code    string
	}{
		{"approved", "", "pm_card_visa", processor.Approved, ""},
		{"card declined", "", "pm_card_chargeDeclinedInsufficientFunds", processor.Declined, "insufficient_funds"},
		{"no such payment method", "", "pm_card_nonexistent", processor.Declined, "resource_missing"},
		{"key in use", stripefake.KeyInUse, "pm_card_visa", processor.Unknown, "idempotency_key_in_use"},
		{"rate limited", stripefake.RateLimited, "pm_card_visa", processor.Unknown, "rate_limit"},
		{"server error", stripefake.ServerError, "pm_card_visa", processor.Unknown, "status_500"},
		{"bad API key", stripefake.BadAPIKey, "pm_card_visa", processor.Unknown, "authentication_failed"},
		{"answer lost", stripefake.LoseAnswer, "pm_card_visa", processor.Unknown, "connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := stripefake.Start(t)
			fake.Fail(tc.fault)
			r := connect(t, fake, -1).Authorize(t.Context(), authorization("ch_1", tc.pm, 1200))
			if r.Outcome != tc.outcome || r.Code != tc.code {
				t.Errorf("%s: %s %q (%v), want %s %q", tc.name, r.Outcome, r.Code, r.Err, tc.outcome, tc.code)
			}
			if tc.outcome == processor.Approved && (r.Payment.CapturedAmount != 1200 || r.Payment.Reference != "ch_1") {
				t.Errorf("approved payment %+v, want 1200 captured under ch_1", r.Payment)
			}
		})
	}
}

// The same processor key with other parameters is a bug of ours: never a
// decline, the outcome stays unknown.
func TestSameKeyOtherParametersIsNeverADecline(t *testing.T) {
	fake := stripefake.Start(t)
	s := connect(t, fake, -1)
	if r := s.Authorize(t.Context(), authorization("ch_1", "pm_card_visa", 1200)); r.Outcome != processor.Approved {
		t.Fatalf("first: %+v", r)
	}
	r := s.Authorize(t.Context(), authorization("ch_1", "pm_card_visa", 1300))
	if r.Outcome != processor.Unknown || r.Code != "idempotency_key_mismatch" {
		t.Errorf("same key, other amount: %s %q, want unknown idempotency_key_mismatch", r.Outcome, r.Code)
	}
	if n := len(fake.Intents()); n != 1 {
		t.Errorf("%d intents, want 1", n)
	}
}

// An answer lost after the intent was created: the outcome is unknown; a
// search by our reference does not see it while Stripe's index lags; the
// authorization sent again under the same key is answered from the first
// (one intent, approved); once indexed, the search finds it.
func TestLostAnswerIsFoundByTheSameKeyThenBySearch(t *testing.T) {
	fake := stripefake.Start(t)
	fake.SearchLag = 300 * time.Millisecond
	s := connect(t, fake, -1)
	fake.Fail(stripefake.LoseAnswer)
	a := authorization("ch_lost", "pm_card_visa", 4200)
	if r := s.Authorize(t.Context(), a); r.Outcome != processor.Unknown {
		t.Fatalf("lost answer: %+v, want unknown", r)
	}
	found, err := s.Lookup(t.Context(), "ch_lost")
	if err != nil || len(found) != 0 {
		t.Fatalf("search while the index lags: %+v %v, want nothing found and no error", found, err)
	}
	r := s.Authorize(t.Context(), a)
	intents := fake.Intents()
	if r.Outcome != processor.Approved || len(intents) != 1 || r.Payment.PSPReference != intents[0].ID {
		t.Fatalf("sent again: %+v with intents %+v, want the first intent, approved", r, intents)
	}
	time.Sleep(fake.SearchLag)
	found, err = s.Lookup(t.Context(), "ch_lost")
	if err != nil || len(found) != 1 || found[0].Status != "captured" || found[0].CapturedAmount != 4200 || found[0].Reference != "ch_lost" {
		t.Errorf("search once indexed: %+v %v, want the intent, captured 4200", found, err)
	}
}

// stripe-go sends a request whose answer was lost again by itself, under
// the same key: Stripe answers from the first, one intent. (It does not
// resend a 5xx: that outcome stays unknown, for recovery.)
func TestResentLostAnswerChargesOnce(t *testing.T) {
	fake := stripefake.Start(t)
	fake.Fail(stripefake.LoseAnswer)
	r := connect(t, fake, 2).Authorize(t.Context(), authorization("ch_1", "pm_card_visa", 500))
	if r.Outcome != processor.Approved || len(fake.Intents()) != 1 || fake.Requests("POST /v1/payment_intents") != 2 {
		t.Errorf("%+v, %d intents, %d requests; want approved, 1 intent, 2 requests", r, len(fake.Intents()), fake.Requests("POST /v1/payment_intents"))
	}
}

// Capture, void, refund and reversal against the fake's state.
func TestFollowUpsAndReversal(t *testing.T) {
	fake := stripefake.Start(t)
	s := connect(t, fake, -1)
	a := authorization("ch_2", "pm_card_visa", 1000)
	a.Capture = false
	auth := s.Authorize(t.Context(), a)
	if auth.Outcome != processor.Approved || auth.Payment.Status != "authorized" {
		t.Fatalf("authorize: %+v", auth)
	}
	psp := auth.Payment.PSPReference
	if r := s.Capture(t.Context(), "ch_2:capture", psp, 600); r.Outcome != processor.Approved || r.Payment.CapturedAmount != 600 {
		t.Errorf("capture: %+v", r)
	}
	if r := s.Void(t.Context(), "ch_2:void", psp); r.Outcome != processor.Declined || r.Code != "payment_intent_unexpected_state" {
		t.Errorf("void of a captured intent: %+v, want declined payment_intent_unexpected_state", r)
	}
	if r := s.Refund(t.Context(), "ch_2:refund", psp, 100); r.Outcome != processor.Approved {
		t.Errorf("refund: %+v", r)
	}
	// The reversal refunds what is left (500), under a key of its own.
	if r := s.Reverse(t.Context(), "ch_2:reverse-1", "ch_2"); r.Outcome != processor.Approved || len(r.Payments) != 1 {
		t.Errorf("reverse: %+v", r)
	}
	if in := fake.Intents()[0]; in.AmountRefunded != 600 {
		t.Errorf("after the reversal: %+v, want all 600 captured refunded", in)
	}
	// Another authorization, voided.
	b := authorization("ch_3", "pm_card_visa", 700)
	b.Capture = false
	psp = s.Authorize(t.Context(), b).Payment.PSPReference
	if r := s.Void(t.Context(), "ch_3:void", psp); r.Outcome != processor.Approved || r.Payment.Status != "voided" {
		t.Errorf("void: %+v", r)
	}
}
