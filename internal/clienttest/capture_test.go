package clienttest_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/testkit"
)

// authorize holds amount on the account with a charge created with Capture
// false, and checks the answer is an authorization.
func (f *fixture) authorize(c *client.Client, accountID string, amount int64) client.Charge {
	f.t.Helper()
	capture := false
	res, err := c.CreateCharge(context.Background(), client.NewCharge{AccountID: accountID, Amount: amount, Currency: "USD", Capture: &capture})
	if err != nil {
		f.t.Fatal(err)
	}
	ch := res.Data
	if ch.Status != client.ChargeStatusAuthorized || ch.Amount != amount || ch.AmountCaptured != 0 || ch.ExpiresAt == nil || !ch.ExpiresAt.After(ch.CreatedAt) {
		f.t.Fatalf("authorization %+v, want authorized, %d held, nothing captured, an expires_at after created_at", ch, amount)
	}
	if res.Location != "/v1/charges/"+ch.ID {
		f.t.Errorf("Location %q", res.Location)
	}
	return ch
}

// money reads the account's balance and available funds through the API,
// and checks the balance against the ledger.
func (f *fixture) money(c *client.Client, accountID string) (balance, available int64) {
	f.t.Helper()
	ctx := context.Background()
	res, err := c.GetAccount(ctx, accountID)
	if err != nil {
		f.t.Fatal(err)
	}
	if b := testkit.Balance(ctx, f.t, f.db, f.merchantID, accountID); b != res.Data.Balance {
		f.t.Errorf("GetAccount says balance %d, the ledger %d", res.Data.Balance, b)
	}
	return res.Data.Balance, res.Data.Available
}

// An authorization holds its amount (available drops, the balance does not),
// a partial capture takes only what it names and releases the rest, and a
// void of the captured charge is refused at once with its status.
func TestAuthorizeCaptureThenVoidRefused(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	c := f.client(f.url, client.WithRetryPolicy(fast))
	acct := f.fundedAccount(10_000)

	auth := f.authorize(c, acct.ID, 3_000)
	if b, a := f.money(c, acct.ID); b != 10_000 || a != 7_000 {
		t.Errorf("after the authorization: balance %d, available %d; want 10000 and 7000", b, a)
	}

	amount := int64(2_500)
	res, err := c.Capture(ctx, auth.ID, client.CaptureCharge{Amount: &amount})
	if err != nil {
		t.Fatal(err)
	}
	ch := res.Data
	if ch.ID != auth.ID || ch.Status != client.ChargeStatusSucceeded || ch.Amount != 3_000 || ch.AmountCaptured != 2_500 ||
		ch.ExpiresAt == nil || !ch.ExpiresAt.Equal(*auth.ExpiresAt) {
		t.Errorf("captured %+v, want %s succeeded, amount 3000, 2500 captured, its expires_at kept", ch, auth.ID)
	}
	if res.Replayed || res.Location != "" {
		t.Errorf("Replayed %v, Location %q; want a fresh 200 without Location", res.Replayed, res.Location)
	}
	if b, a := f.money(c, acct.ID); b != 7_500 || a != 7_500 {
		t.Errorf("after the capture: balance %d, available %d; want 7500 and 7500 (the rest of the hold released)", b, a)
	}

	void, err := c.Void(ctx, auth.ID)
	var p *client.Problem
	if !errors.As(err, &p) || p.Status != http.StatusConflict || p.Code != client.CodeChargeNotVoidable ||
		p.ChargeStatus != string(client.ChargeStatusSucceeded) {
		t.Fatalf("void of the captured charge: %v (%+v), want 409 charge-not-voidable with charge_status succeeded", err, p)
	}
	if errors.Is(err, client.ErrGaveUp) || void.Attempts != 1 {
		t.Errorf("the refusal took %d attempts (%v); want 1: it is final", void.Attempts, err)
	}
	if b, a := f.money(c, acct.ID); b != 7_500 || a != 7_500 {
		t.Errorf("after the refused void: balance %d, available %d; want 7500 and 7500", b, a)
	}
	got, err := c.GetCharge(ctx, auth.ID)
	if err != nil || got.Data.Status != client.ChargeStatusSucceeded || got.Data.AmountCaptured != 2_500 {
		t.Errorf("GetCharge %+v, %v; want succeeded with 2500 captured", got, err)
	}
	if n := f.chargeRows(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	f.waitForEvents(c, map[client.EventType]int{client.EventTypeChargeAuthorized: 1, client.EventTypeChargeCaptured: 1})
}

// A capture whose answer is lost after the service committed it completes on
// the retry with the same key: the money is taken once, the stored answer is
// replayed byte for byte, and a second capture with a new key is refused.
func TestCaptureLostAnswerDebitsOnce(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	acct := f.fundedAccount(10_000)
	auth := f.authorize(f.client(f.url), acct.ID, 3_000)

	lost := &loseFirst{next: http.DefaultTransport}
	c := f.client(f.url, client.WithHTTPClient(&http.Client{Transport: lost}), client.WithRetryPolicy(fast))
	amount := int64(2_000)
	res, err := c.Capture(ctx, auth.ID, client.CaptureCharge{Amount: &amount})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Attempts != 2 {
		t.Errorf("Replayed %v, Attempts %d; want a replay on the 2nd attempt", res.Replayed, res.Attempts)
	}
	if res.Data.Status != client.ChargeStatusSucceeded || res.Data.AmountCaptured != 2_000 {
		t.Errorf("charge %+v, want succeeded with 2000 captured", res.Data)
	}
	a := lost.all()
	if len(a) != 2 {
		t.Fatalf("%d requests reached the service, want 2", len(a))
	}
	if a[0].status != http.StatusOK || !bytes.Equal(a[0].answer, a[1].answer) {
		t.Errorf("the replay differs from the lost answer:\nlost   %d %s\nreplay %d %s", a[0].status, a[0].answer, a[1].status, a[1].answer)
	}
	sameKeyAndBody(t, a, res.IdempotencyKey)

	plain := f.client(f.url)
	if b, av := f.money(plain, acct.ID); b != 8_000 || av != 8_000 {
		t.Errorf("balance %d, available %d; want 8000 and 8000: debited once, the rest of the hold released", b, av)
	}
	_, err = plain.Capture(ctx, auth.ID, client.CaptureCharge{})
	var p *client.Problem
	if !errors.As(err, &p) || p.Code != client.CodeChargeNotCapturable || p.ChargeStatus != string(client.ChargeStatusSucceeded) {
		t.Errorf("a second capture with a new key: %v, want charge-not-capturable with charge_status succeeded", err)
	}
	if b, _ := f.money(plain, acct.ID); b != 8_000 {
		t.Errorf("balance %d after the refused second capture, want 8000", b)
	}
	if n := f.chargeRows(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	f.waitForEvents(plain, map[client.EventType]int{client.EventTypeChargeAuthorized: 1, client.EventTypeChargeCaptured: 1})
}

// waitForEvents reads the merchant's whole feed until it holds exactly want
// of each type named, or fails after 10 s. The feed is filled as
// transactions commit, so the events of what just happened may lag.
func (f *fixture) waitForEvents(c *client.Client, want map[client.EventType]int) {
	f.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := map[client.EventType]int{}
		var after *string
		for {
			page, err := c.ListEvents(ctx, client.ListEventsParams{Limit: &[]int{100}[0], StartingAfter: after})
			if err != nil {
				f.t.Fatal(err)
			}
			for _, e := range page.Data.Data {
				got[e.Type]++
			}
			if !page.Data.HasMore {
				break
			}
			after = &page.Data.Data[len(page.Data.Data)-1].ID
		}
		done := true
		for typ, n := range want {
			done = done && got[typ] == n
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("events by type %v, want %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
