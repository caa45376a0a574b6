package cards_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/processor/stripeproc"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/stripefake"
)

// Card charges through the Stripe connector, against the Stripe-shaped
// fake (stripe-mock keeps no state), on the real service and database.

const stripeWebhookSecret = "whsec_test_stripe"

// setupStripe starts the service with o, charging at a fake Stripe.
func setupStripe(t *testing.T, o cards.Options) (*bundle, *stripefake.Server) {
	t.Helper()
	fake := stripefake.Start(t)
	s, err := stripeproc.New(t.Context(), stripeproc.Config{APIKey: "sk_test_123", APIBase: fake.URL, Account: "acct_fake",
		MaxNetworkRetries: -1, HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	// Stripe decides as it answers: the deadline only bounds re-drives.
	o = testBounds(o, 30*time.Second)
	o.Processor, o.Webhooks = s, stripeproc.Webhooks{Secret: stripeWebhookSecret}
	b := &bundle{dbURL: pgtest.NewDatabase(t), client: &http.Client{Timeout: 30 * time.Second}}
	b.api = testkit.StartAPI(t, b.dbURL, testkit.APIOptions{Cards: &o})
	return b, fake
}

// An answer lost after Stripe created the intent, while its search does not
// show it yet: recovery sends the authorization again under the same key,
// which Stripe answers from the first. One intent, the charge succeeded,
// and the retry of the client's request replays its answer.
func TestStripeLostAnswerIsRecoveredUnderTheSameKey(t *testing.T) {
	t.Parallel()
	b, fake := setupStripe(t, cards.Options{Wait: 200 * time.Millisecond})
	fake.SearchLag = time.Minute
	fake.Fail(stripefake.LoseAnswer)
	first := b.charge(t, "k-stripe-lost", "pm_card_visa")
	if first.status != http.StatusAccepted && first.status != http.StatusCreated {
		t.Fatalf("charge whose answer is lost: %d %s, want 202 (or 201 once recovered)", first.status, first.body)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	if r.opState != "succeeded" || r.keyStatus != http.StatusCreated ||
		strings.Join(r.events, ",") != "charge.processing,charge.succeeded" {
		t.Errorf("after recovery: %+v", r)
	}
	intents := fake.Intents()
	if len(intents) != 1 || intents[0].AmountReceived != 1000 || intents[0].Reference != id || fake.Requests("POST /v1/payment_intents") != 2 {
		t.Fatalf("Stripe's intents: %+v after %d creations, want one, 1000 captured under %s, created once and asked again once",
			intents, fake.Requests("POST /v1/payment_intents"), id)
	}
	again := b.charge(t, "k-stripe-lost", "pm_card_visa")
	if again.status != http.StatusCreated || chargeID(t, again) != id || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %s, want the stored 201 of %s replayed", again.status, again.body, id)
	}
	declined := b.charge(t, "k-stripe-declined", "pm_card_chargeDeclinedInsufficientFunds")
	if declined.status != http.StatusPaymentRequired || !strings.Contains(string(declined.body), "insufficient_funds") {
		t.Errorf("declined card: %d %s, want 402 naming insufficient_funds", declined.status, declined.body)
	}
}

// Stripe refusing our processor key for other parameters (a bug of ours)
// never declines the charge: it stays processing, the refusal is counted
// for the alert, and recovery resolves it.
func TestStripeKeyMismatchIsNeverADecline(t *testing.T) {
	t.Parallel()
	b, fake := setupStripe(t, cards.Options{Wait: 200 * time.Millisecond})
	fake.Fail(stripefake.OtherParameters)
	a := b.charge(t, "k-stripe-mismatch", "pm_card_visa")
	if a.status == http.StatusPaymentRequired {
		t.Fatalf("charge: %d %s, want no decline", a.status, a.body)
	}
	id := chargeID(t, a)
	if r := b.waitFor(t, id, "succeeded", 10*time.Second); r.events[len(r.events)-1] != "charge.succeeded" {
		t.Errorf("after recovery: %+v", r)
	}
	if n := b.api.Cards.Stats.KeyMismatches.Load(); n != 1 {
		t.Errorf("%d key mismatches counted, want 1", n)
	}
	if n := len(fake.Intents()); n != 1 {
		t.Errorf("%d intents, want 1", n)
	}
}

// stripeEvent is a Stripe event about the intent, signed at when with
// secret.
func stripeEvent(evID, typ string, in stripefake.Intent, status string, secret string, when time.Time) (string, []byte) {
	body := fmt.Appendf(nil, `{"id": %q, "object": "event", "type": %q, "api_version": "2025-08-27.basil", "created": %d,
  "data": {"object": {"id": %q, "object": "payment_intent", "amount": %d, "currency": "eur", "status": %q,
    "amount_received": %d, "metadata": {"reference": %q}}}}`,
		evID, typ, when.Unix(), in.ID, in.Amount, status, in.AmountReceived, in.Reference)
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: when})
	return signed.Header, body
}

func (b *bundle) postStripeEvent(t *testing.T, signature string, body []byte) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.api.URL+"/v1/processor/stripe/events", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", signature)
	return b.do(t, req)
}

// Stripe's webhooks, signed by stripe-go's test helper: a verified event
// makes the service look and apply what Stripe says, once; a duplicate, an
// event out of order, a bad signature and a stale one change nothing.
func TestStripeWebhooks(t *testing.T) {
	t.Parallel()
	// Recovery runs at the start, then not for an hour: only the webhooks
	// resolve the charge.
	b, fake := setupStripe(t, cards.Options{Wait: 100 * time.Millisecond, Interval: time.Hour})
	fake.Fail(stripefake.LoseAnswer)
	lost := b.charge(t, "k-stripe-hook", "pm_card_visa")
	if lost.status != http.StatusAccepted {
		t.Fatalf("charge whose answer is lost: %d %s, want 202", lost.status, lost.body)
	}
	id := chargeID(t, lost)
	in := fake.Intents()[0]
	now := time.Now()

	for name, sig := range map[string]struct {
		secret string
		when   time.Time
	}{
		"bad signature": {"whsec_other", now},
		"stale":         {stripeWebhookSecret, now.Add(-10 * time.Minute)},
	} {
		h, body := stripeEvent("evt_bad", "payment_intent.succeeded", in, "succeeded", sig.secret, sig.when)
		if a := b.postStripeEvent(t, h, body); a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "STRIPE_WEBHOOK_SECRET") {
			t.Errorf("%s: %d %s, want 400 naming STRIPE_WEBHOOK_SECRET", name, a.status, a.body)
		}
	}
	if r := b.rowsOf(t, id); r.status != "processing" || r.processorEvents != 0 {
		t.Fatalf("after webhooks that do not verify: %+v, want the charge processing and no event recorded", r)
	}

	h, body := stripeEvent("evt_1", "payment_intent.succeeded", in, "succeeded", stripeWebhookSecret, now)
	for range 2 { // delivered twice
		if a := b.postStripeEvent(t, h, body); a.status != http.StatusOK {
			t.Fatalf("verified event: %d %s, want 200", a.status, a.body)
		}
	}
	r := b.rowsOf(t, id)
	if r.status != "succeeded" || r.processorEvents != 1 || strings.Join(r.events, ",") != "charge.processing,charge.succeeded" {
		t.Errorf("after the event, delivered twice: %+v, want succeeded once, the event recorded once", r)
	}
	// Out of order: an event from before the success, delivered after.
	h, body = stripeEvent("evt_0", "payment_intent.processing", in, "processing", stripeWebhookSecret, now)
	if a := b.postStripeEvent(t, h, body); a.status != http.StatusOK {
		t.Errorf("older event: %d %s, want 200", a.status, a.body)
	}
	if r := b.rowsOf(t, id); r.status != "succeeded" || len(r.events) != 2 {
		t.Errorf("after an older event: %+v, want the charge as it was", r)
	}
	if n := len(fake.Intents()); n != 1 {
		t.Errorf("%d intents at Stripe, want 1", n)
	}
}
