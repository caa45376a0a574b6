package clienttest_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestCardChargeThroughTheClient: the Go client charges a test card of the
// real simulator through the real service: an approval is a Result with
// StatusCode 201; a decline a *Problem card-declined with its DeclineCode;
// a late answer a 202 (Data processing, RetryAfter set) that WaitForCharge
// follows, honouring Retry-After, to the charge succeeded, which a retry
// under the same key then replays. The simulator approves each approved
// card once.
func TestCardChargeThroughTheClient(t *testing.T) {
	t.Parallel()
	sim := procsimtest.Start(t, "-decision-deadline", "4s")
	api := testkit.StartAPI(t, pgtest.DatabaseURL(t), testkit.APIOptions{MaxConns: 10, Cards: &cards.Options{
		// Keep-alives off: a lost answer stays lost (Go's client would send
		// the request again by itself on a reused connection).
		Processor: processor.NewSimulator(sim.URL(), &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}),
		Wait:      500 * time.Millisecond, CallTimeout: time.Second, DecisionDeadline: 4 * time.Second,
		Interval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
	}})
	c := client.New(api.URL, api.APIKey, client.WithRetryPolicy(fast))
	ctx := context.Background()

	ok, err := c.CreateCharge(ctx, client.NewCharge{PaymentMethod: "pm_card_approve", Amount: 1200, Currency: "EUR"})
	if err != nil || ok.StatusCode != http.StatusCreated || ok.Data.Status != client.ChargeStatusSucceeded ||
		ok.Data.PaymentMethod != "pm_card_approve" || ok.Data.AccountID != "" {
		t.Fatalf("approve: %+v, %v; want 201 succeeded naming the card and no account", ok, err)
	}

	_, err = c.CreateCharge(ctx, client.NewCharge{PaymentMethod: "pm_card_decline_insufficient_funds", Amount: 1200, Currency: "EUR"})
	var p *client.Problem
	if !errors.As(err, &p) || p.Code != client.CodeCardDeclined || p.DeclineCode != "insufficient_funds" || p.ChargeID == "" {
		t.Fatalf("decline: %v; want a *Problem card-declined, insufficient_funds, naming the charge", err)
	}

	key := client.WithIdempotencyKey("late-" + t.Name())
	late, err := c.CreateCharge(ctx, client.NewCharge{PaymentMethod: "pm_card_approve_answer_late", Amount: 700, Currency: "EUR"}, key)
	if err != nil || late.StatusCode != http.StatusAccepted || late.Data.Status != client.ChargeStatusProcessing || late.RetryAfter <= 0 {
		t.Fatalf("late answer: %+v, %v; want 202 processing with a Retry-After", late, err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	began := time.Now()
	final, err := c.WaitForCharge(waitCtx, late)
	if err != nil || final.Data.Status != client.ChargeStatusSucceeded || final.Data.ID != late.Data.ID {
		t.Fatalf("WaitForCharge: %+v, %v; want the same charge succeeded", final, err)
	}
	if took := time.Since(began); took < late.RetryAfter {
		t.Errorf("WaitForCharge read the charge after %v, before the Retry-After of %v", took, late.RetryAfter)
	}
	again, err := c.CreateCharge(ctx, client.NewCharge{PaymentMethod: "pm_card_approve_answer_late", Amount: 700, Currency: "EUR"}, key)
	if err != nil || !again.Replayed || again.StatusCode != http.StatusCreated || again.Data.ID != late.Data.ID {
		t.Fatalf("retry under the key: %+v, %v; want the 201 replayed for the same charge", again, err)
	}

	approvals := 0
	for _, r := range sim.Audit(t).References {
		approvals += r.Approvals
	}
	if approvals != 2 {
		t.Errorf("the simulator approved %d times, want 2: each approved card once", approvals)
	}
}
