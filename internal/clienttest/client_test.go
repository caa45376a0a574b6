package clienttest_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/testkit"
)

// A charge whose answer is lost after the service committed it completes on
// the retry: one charge row, the money taken once, and the stored answer
// replayed byte for byte.
func TestLostAnswerCompletesOnRetry(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(10_000)
	lost := &loseFirst{next: http.DefaultTransport}
	c := f.client(f.url, client.WithHTTPClient(&http.Client{Transport: lost}), client.WithRetryPolicy(fast))

	res, err := c.CreateCharge(context.Background(), client.NewCharge{AccountID: acct.ID, Amount: 2_500, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Attempts != 2 {
		t.Errorf("Replayed %v, Attempts %d; want a replay on the 2nd attempt", res.Replayed, res.Attempts)
	}
	if res.Data.Status != client.ChargeStatusSucceeded || res.Data.Amount != 2_500 {
		t.Errorf("charge %+v", res.Data)
	}
	if res.Location != "/v1/charges/"+res.Data.ID {
		t.Errorf("Location %q", res.Location)
	}
	if n := f.chargeRows(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	if b := testkit.Balance(context.Background(), t, f.db, f.merchantID, acct.ID); b != 7_500 {
		t.Errorf("balance %d, want 7500", b)
	}
	a := lost.all()
	if len(a) != 2 {
		t.Fatalf("%d requests reached the service, want 2", len(a))
	}
	if !bytes.Equal(a[0].answer, a[1].answer) || a[0].status != http.StatusCreated {
		t.Errorf("the replay differs from the lost answer:\nlost   %d %s\nreplay %d %s", a[0].status, a[0].answer, a[1].status, a[1].answer)
	}
	sameKeyAndBody(t, a, res.IdempotencyKey)
	// The lost attempt's request id too, so that support can find the
	// request that executed in the service's logs.
	if len(res.RequestIDs) != 2 || res.RequestIDs[0] != a[0].reqID || res.RequestIDs[1] != a[1].reqID || a[0].reqID == a[1].reqID {
		t.Errorf("RequestIDs %v, want the ids sent, %q and %q, distinct", res.RequestIDs, a[0].reqID, a[1].reqID)
	}
}

// sameKeyAndBody asserts that every attempt carried key, a UUIDv7 unless the
// caller chose it, and the very same body bytes.
func sameKeyAndBody(t *testing.T, attempts []attempt, key string) {
	t.Helper()
	for i, a := range attempts {
		if a.key != key {
			t.Errorf("attempt %d: Idempotency-Key %q, want %q", i+1, a.key, key)
		}
		if !bytes.Equal(a.body, attempts[0].body) {
			t.Errorf("attempt %d: body %s differs from the first attempt's %s", i+1, a.body, attempts[0].body)
		}
	}
}

// 409 idempotency-key-in-use, 429 and 503 are retried with the same key and
// body, after a backoff no longer than the policy's bound for each attempt,
// until the real answer comes.
func TestRetriesWhatDidNotExecute(t *testing.T) {
	tooMany := fault{status: http.StatusTooManyRequests, body: `{"type":"/problems/x","title":"Too many","status":429,"detail":"slow down","code":"too-many-requests"}`}
	for name, faults := range map[string][]fault{
		"409 in use":      {inUse, inUse},
		"503 unavailable": {unavailable, unavailable, unavailable},
		"429":             {tooMany},
		"mixed":           {unavailable, inUse, tooMany},
	} {
		t.Run(name, func(t *testing.T) {
			f := setup(t)
			acct := f.fundedAccount(1_000)
			p := f.proxy(faults...)
			start := time.Now()
			res, err := f.client(p.url, client.WithRetryPolicy(fast)).
				CreateCharge(context.Background(), client.NewCharge{AccountID: acct.ID, Amount: 300, Currency: "USD"})
			if err != nil {
				t.Fatal(err)
			}
			a := p.all()
			if len(a) != len(faults)+1 || res.Attempts != len(a) || len(res.RequestIDs) != len(a) {
				t.Fatalf("%d attempts seen, Result says %d with %d request ids; want %d", len(a), res.Attempts, len(res.RequestIDs), len(faults)+1)
			}
			if res.Replayed {
				t.Error("Replayed: the charge executed only on the last attempt")
			}
			sameKeyAndBody(t, a, res.IdempotencyKey)
			if k, err := uuid.Parse(res.IdempotencyKey); err != nil || k.Version() != 7 {
				t.Errorf("generated key %q is not a UUIDv7", res.IdempotencyKey)
			}
			// Full jitter: the wait before attempt n+1 is at most
			// BaseDelay·2^(n-1), capped at MaxDelay (plus scheduling slack).
			prev := start
			for i, at := range a {
				if i > 0 {
					bound := min(fast.BaseDelay<<(i-1), fast.MaxDelay)
					if gap := at.at.Sub(prev); gap > bound+100*time.Millisecond {
						t.Errorf("wait before attempt %d was %v, over its bound %v", i+1, gap, bound)
					}
				}
				prev = at.at
			}
			if n := f.chargeRows(); n != 1 {
				t.Errorf("%d charge rows, want 1", n)
			}
			if b := testkit.Balance(context.Background(), t, f.db, f.merchantID, acct.ID); b != 700 {
				t.Errorf("balance %d, want 700", b)
			}
		})
	}
}

// Retries stop at MaxAttempts, and the error wraps ErrGaveUp and the last
// answer, a *Problem.
func TestAttemptCap(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(1_000)
	p := f.proxy(unavailable, unavailable, unavailable, unavailable, unavailable, unavailable)
	res, err := f.client(p.url, client.WithRetryPolicy(fast)).
		CreateCharge(context.Background(), client.NewCharge{AccountID: acct.ID, Amount: 300, Currency: "USD"})
	if !errors.Is(err, client.ErrGaveUp) {
		t.Fatalf("err = %v, want ErrGaveUp", err)
	}
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Status != http.StatusServiceUnavailable || prob.Code != client.CodeServiceUnavailable {
		t.Errorf("last outcome %#v, want the 503 problem", prob)
	}
	var re *client.RetryError
	if !errors.As(err, &re) || re.Attempts != fast.MaxAttempts || len(re.RequestIDs) != fast.MaxAttempts {
		t.Errorf("RetryError %+v, want %d attempts each with its request id", re, fast.MaxAttempts)
	}
	if got := len(p.all()); got != fast.MaxAttempts || res.Attempts != fast.MaxAttempts {
		t.Errorf("%d requests sent (Result says %d), want the cap %d", got, res.Attempts, fast.MaxAttempts)
	}
	if n := f.chargeRows(); n != 0 {
		t.Errorf("%d charge rows, want none: no attempt reached the service", n)
	}
}

// Retry-After is a floor under the jittered backoff.
func TestRetryAfterHonoured(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(1_000)
	slow := unavailable
	slow.retryAfter = "1"
	p := f.proxy(slow)
	if _, err := f.client(p.url, client.WithRetryPolicy(fast)).
		CreateCharge(context.Background(), client.NewCharge{AccountID: acct.ID, Amount: 300, Currency: "USD"}); err != nil {
		t.Fatal(err)
	}
	a := p.all()
	if len(a) != 2 {
		t.Fatalf("%d attempts, want 2", len(a))
	}
	if gap := a[1].at.Sub(a[0].at); gap < time.Second {
		t.Errorf("retried after %v, before the Retry-After of 1 s", gap)
	}
}

// Refusals are answered at once, as a *Problem, in one attempt: retrying them
// would get the same answer.
func TestRefusalsAreNotRetried(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(1_000)
	missing := "acct_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	for _, tc := range []struct {
		name   string
		charge client.NewCharge
		status int
		code   string
	}{
		{"402 insufficient funds", client.NewCharge{AccountID: acct.ID, Amount: 5_000, Currency: "USD"}, 402, client.CodeInsufficientFunds},
		{"422 currency mismatch", client.NewCharge{AccountID: acct.ID, Amount: 100, Currency: "EUR"}, 422, client.CodeCurrencyMismatch},
		{"404 account not found", client.NewCharge{AccountID: missing, Amount: 100, Currency: "USD"}, 404, client.CodeAccountNotFound},
		{"400 invalid request", client.NewCharge{AccountID: acct.ID, Amount: 0, Currency: "USD"}, 400, client.CodeInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := f.proxy()
			res, err := f.client(p.url, client.WithRetryPolicy(fast)).CreateCharge(context.Background(), tc.charge)
			var prob *client.Problem
			if !errors.As(err, &prob) {
				t.Fatalf("err = %v, want a *client.Problem", err)
			}
			if prob.Status != tc.status || prob.Code != tc.code || prob.RequestID == "" || prob.Title == "" || prob.Type != "/problems/"+tc.code {
				t.Errorf("problem %+v, want %d %s with a request id", prob, tc.status, tc.code)
			}
			if errors.Is(err, client.ErrGaveUp) {
				t.Error("a refusal is not a give-up")
			}
			if got := len(p.all()); got != 1 || res.Attempts != 1 {
				t.Errorf("%d requests sent (Result says %d), want 1", got, res.Attempts)
			}
			if tc.code == client.CodeInsufficientFunds && prob.ChargeID == "" {
				t.Error("insufficient-funds without the charge_id of the failed charge")
			}
		})
	}
	if b := testkit.Balance(context.Background(), t, f.db, f.merchantID, acct.ID); b != 1_000 {
		t.Errorf("balance %d, want 1000 untouched", b)
	}
}

// A context deadline stops the retries; the error says so and carries the
// last answer.
func TestDeadlineStopsRetrying(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(1_000)
	slow := unavailable
	slow.retryAfter = "1"
	p := f.proxy(slow, slow, slow, slow, slow, slow, slow, slow)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.client(p.url, client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 8, BaseDelay: 10 * time.Millisecond})).
		CreateCharge(ctx, client.NewCharge{AccountID: acct.ID, Amount: 300, Currency: "USD"})
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrGaveUp) {
		t.Fatalf("err = %v, want ErrGaveUp and context.DeadlineExceeded", err)
	}
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Status != http.StatusServiceUnavailable || prob.RetryAfter != time.Second {
		t.Errorf("last outcome %+v, want the 503 with Retry-After 1 s", prob)
	}
	if got := len(p.all()); got != 2 {
		t.Errorf("%d attempts, want 2 (at 0 s and 1 s; a third would start after the deadline)", got)
	}
	if elapsed > 1500*time.Millisecond {
		t.Errorf("returned after %v, past the deadline", elapsed)
	}
}

// When the deadline cuts an attempt short, the error reports the last answer
// that came, not the cut attempt's own context error.
func TestDeadlineDuringAttempt(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(1_000)
	hung := unavailable
	hung.hang = time.Minute
	p := f.proxy(unavailable, hung)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	res, err := f.client(p.url, client.WithRetryPolicy(fast)).
		CreateCharge(ctx, client.NewCharge{AccountID: acct.ID, Amount: 300, Currency: "USD"})
	var re *client.RetryError
	if !errors.As(err, &re) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a *RetryError for the deadline", err)
	}
	var prob *client.Problem
	if !errors.As(re.Last, &prob) || prob.Status != http.StatusServiceUnavailable {
		t.Errorf("Last = %v, want the first attempt's 503", re.Last)
	}
	if res.Attempts != 2 || len(res.RequestIDs) != 2 || len(p.all()) != 1 {
		t.Errorf("Attempts %d, RequestIDs %v, answered %d; want 2 sent, 1 answered", res.Attempts, res.RequestIDs, len(p.all()))
	}
}

// GetDeposit and GetRefund read back what the POSTs created, at the
// Location they answered.
func TestReadBack(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	c := f.client(f.url)
	acct := f.fundedAccount(0)
	dep, err := c.Deposit(ctx, acct.ID, client.NewDeposit{Amount: 900})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetDeposit(ctx, acct.ID, dep.Data.ID)
	if err != nil || got.Data.Amount != 900 || dep.Location != "/v1/accounts/"+acct.ID+"/deposits/"+dep.Data.ID {
		t.Errorf("GetDeposit %+v, %v; Location %q", got, err, dep.Location)
	}
	ch, err := c.CreateCharge(ctx, client.NewCharge{AccountID: acct.ID, Amount: 900, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := c.CreateRefund(ctx, ch.Data.ID, client.NewRefund{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.GetRefund(ctx, ch.Data.ID, ref.Data.ID)
	if err != nil || r.Data.Amount != 900 {
		t.Errorf("GetRefund %+v, %v; want the whole 900 refunded", r, err)
	}
	a, err := c.GetAccount(ctx, acct.ID)
	if err != nil || a.Data.Balance != 900 {
		t.Errorf("GetAccount %+v, %v; want balance 900", a, err)
	}
	_, err = c.GetCharge(ctx, "ch_"+strings.ReplaceAll(uuid.NewString(), "-", ""))
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Code != client.CodeNotFound {
		t.Errorf("unknown charge: %v, want not-found", err)
	}
}

// A key the caller chooses is sent as given, and sending the same operation
// again with it replays the first outcome instead of charging twice.
func TestCallerKeyReplays(t *testing.T) {
	f := setup(t)
	acct := f.fundedAccount(1_000)
	c := f.client(f.url)
	key := "order-1042-charge"
	in := client.NewCharge{AccountID: acct.ID, Amount: 400, Currency: "USD"}
	first, err := c.CreateCharge(context.Background(), in, client.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateCharge(context.Background(), in, client.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || !again.Replayed || again.Data.ID != first.Data.ID || again.IdempotencyKey != key {
		t.Errorf("first %+v\nagain %+v\nwant the same charge, replayed the second time", first, again)
	}
	if n := f.chargeRows(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	// The same key for another operation is refused, not retried.
	_, err = c.CreateCharge(context.Background(), client.NewCharge{AccountID: acct.ID, Amount: 401, Currency: "USD"}, client.WithIdempotencyKey(key))
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Code != client.CodeKeyReused {
		t.Errorf("err = %v, want idempotency-key-reused", err)
	}
}

// Refunds, reads, the paged charge list and the event feed.
func TestRefundListAndEvents(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	acct := f.fundedAccount(10_000)
	c := f.client(f.url)
	var ids []string
	for i := range 5 {
		res, err := c.CreateCharge(ctx, client.NewCharge{AccountID: acct.ID, Amount: int64(100 * (i + 1)), Currency: "USD"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Data.ID)
	}
	amount := int64(150)
	ref, err := c.CreateRefund(ctx, ids[2], client.NewRefund{Amount: &amount})
	if err != nil {
		t.Fatal(err)
	}
	if ref.Data.ChargeID != ids[2] || ref.Data.Amount != 150 {
		t.Errorf("refund %+v", ref.Data)
	}
	ch, err := c.GetCharge(ctx, ids[2])
	if err != nil || ch.Data.AmountRefunded != 150 {
		t.Errorf("GetCharge: %+v, %v; want amount_refunded 150", ch, err)
	}
	_, err = c.CreateRefund(ctx, ids[2], client.NewRefund{Amount: &[]int64{200}[0]})
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Code != client.CodeRefundExceedsCharge {
		t.Errorf("over-refund: %v, want refund-exceeds-charge", err)
	}
	// 10000 − (100+200+300+400+500) + 150
	if b := testkit.Balance(ctx, t, f.db, f.merchantID, acct.ID); b != 8_650 {
		t.Errorf("balance %d, want 8650", b)
	}

	limit := 2
	var listed []string
	for ch, err := range c.Charges(ctx, client.ListChargesParams{AccountID: &acct.ID, Limit: &limit}) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, ch.ID)
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if len(listed) != len(want) {
		t.Fatalf("listed %v, want %v (newest first)", listed, want)
	}
	for i := range want {
		if listed[i] != want[i] {
			t.Fatalf("listed %v, want %v (newest first)", listed, want)
		}
	}

	// The feed is filled as transactions commit; wait for this account's
	// refund to appear rather than assume it is there.
	deadline := time.Now().Add(10 * time.Second)
	for {
		types := map[client.EventType]int{}
		var after *string
		for {
			page, err := c.ListEvents(ctx, client.ListEventsParams{Limit: &[]int{100}[0], StartingAfter: after})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.Data.Data {
				types[e.Type]++
				if e.Type != client.EventTypeChargeSucceeded {
					continue
				}
				// The generated union decodes the event's object.
				ch, err := e.Data.AsCharge()
				if d, derr := e.Data.Discriminator(); err != nil || derr != nil || d != "charge" || ch.AccountID != acct.ID {
					t.Fatalf("event %s: data %+v (%v), discriminator %q (%v)", e.ID, ch, err, d, derr)
				}
			}
			if !page.Data.HasMore {
				break
			}
			after = &page.Data.Data[len(page.Data.Data)-1].ID
		}
		if types[client.EventTypeAccountCreated] == 1 && types[client.EventTypeDepositCreated] == 1 &&
			types[client.EventTypeChargeSucceeded] == 5 && types[client.EventTypeRefundCreated] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events by type %v, want 1 account, 1 deposit, 5 charges, 1 refund", types)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
