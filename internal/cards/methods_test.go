package cards_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/cards"
)

// The test payment methods of the simulator, each through the API, on real
// PostgreSQL and the real simulator process: what the client is answered,
// what the tables hold (the charge, its operation, one event per transition,
// the key) and what the simulator did (its audit).

// requireReplay sends the charge again under key and wants want's bytes
// back, marked as a replay.
func requireReplay(t *testing.T, b *bundle, key, pm string, want answer) {
	t.Helper()
	again := b.charge(t, key, pm)
	if again.status != want.status || !bytes.Equal(again.body, want.body) || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Location") != want.header.Get("Location") {
		t.Fatalf("replay: %d %s (replayed %q), want %d %s byte for byte", again.status, again.body,
			again.header.Get("Idempotent-Replayed"), want.status, want.body)
	}
}

func wantEvents(t *testing.T, r rows, want ...string) {
	t.Helper()
	if !slices.Equal(r.events, want) {
		t.Errorf("events %v, want %v", r.events, want)
	}
}

func TestApproveAnswers201AndReplaysItByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	first := b.charge(t, "k-approve", "pm_card_approve")
	if first.status != http.StatusCreated || first.header.Get("Location") == "" {
		t.Fatalf("charge: %d %s, want 201 with a Location", first.status, first.body)
	}
	id := chargeID(t, first)
	var c struct {
		PaymentMethod string `json:"payment_method"`
		Status        string `json:"status"`
		Captured      int64  `json:"amount_captured"`
	}
	if err := json.Unmarshal(first.body, &c); err != nil || c.PaymentMethod != "pm_card_approve" || c.Status != "succeeded" || c.Captured != 1000 {
		t.Fatalf("charge body %s (%v)", first.body, err)
	}
	requireReplay(t, b, "k-approve", "pm_card_approve", first)
	r := b.rowsOf(t, id)
	if r.charges != 1 || r.ops != 1 || r.opState != "succeeded" || r.keyStatus != http.StatusCreated {
		t.Errorf("rows %+v", r)
	}
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if a := b.audit(t, id); a.Approvals != 1 {
		t.Errorf("audit %+v, want 1 approval", a)
	}
	// The charge reads back as it was answered.
	got := b.get(t, "/v1/charges/"+id)
	if got.status != http.StatusOK || !bytes.Equal(got.body, first.body) {
		t.Errorf("GET: %d %s, want %s", got.status, got.body, first.body)
	}
	// A card charge cannot be captured here (yet): 409, naming its status.
	capture := b.post(t, "/v1/charges/"+id+"/capture", "k-capture", `{}`)
	if capture.status != http.StatusConflict || !bytes.Contains(capture.body, []byte(`"charge_status":"succeeded"`)) {
		t.Errorf("capture: %d %s, want 409 naming the status", capture.status, capture.body)
	}
}

func TestAuthorizeOnlyAnswersAuthorized(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	first := b.post(t, "/v1/charges", "k-auth", `{"payment_method": "pm_card_approve", "amount": 700, "currency": "USD", "capture": false}`)
	if first.status != http.StatusCreated || !bytes.Contains(first.body, []byte(`"status":"authorized"`)) {
		t.Fatalf("authorization: %d %s", first.status, first.body)
	}
	r := b.rowsOf(t, chargeID(t, first))
	wantEvents(t, r, "charge.processing", "charge.authorized")
}

func TestDeclinesAnswer402StoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	for _, tc := range []struct{ pm, code string }{
		{"pm_card_decline_insufficient_funds", "insufficient_funds"},
		{"pm_card_decline_do_not_honor", "do_not_honor"},
	} {
		first := b.charge(t, "k-"+tc.pm, tc.pm)
		if first.status != http.StatusPaymentRequired || !bytes.Contains(first.body, []byte(`"code":"card-declined"`)) ||
			!bytes.Contains(first.body, []byte(`"decline_code":"`+tc.code+`"`)) {
			t.Fatalf("%s: %d %s, want 402 card-declined naming %s", tc.pm, first.status, first.body, tc.code)
		}
		requireReplay(t, b, "k-"+tc.pm, tc.pm, first)
		id := chargeID(t, first)
		r := b.rowsOf(t, id)
		if r.status != "failed" || r.failure != "card-declined" || r.decline != tc.code || r.opState != "failed" || r.keyStatus != 402 {
			t.Errorf("%s: rows %+v", tc.pm, r)
		}
		wantEvents(t, r, "charge.processing", "charge.failed")
		if a := b.audit(t, id); a.Approvals != 0 {
			t.Errorf("%s: audit %+v, want no approval", tc.pm, a)
		}
	}
}

func TestLostAnswerIs202ThenRecoveredToSucceeded(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, Backoff: 300 * time.Millisecond})
	first := b.charge(t, "k-lost", "pm_card_approve_lose_response")
	if first.status != http.StatusAccepted || first.header.Get("Retry-After") == "" || first.header.Get("Location") == "" ||
		!bytes.Contains(first.body, []byte(`"status":"processing"`)) {
		t.Fatalf("charge: %d %s %v, want 202 processing with Location and Retry-After", first.status, first.body, first.header)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if r.keyStatus != http.StatusCreated || r.charges != 1 {
		t.Errorf("rows %+v", r)
	}
	final := b.charge(t, "k-lost", "pm_card_approve_lose_response")
	if final.status != http.StatusCreated || final.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s, want the stored 201", final.status, final.body)
	}
	requireReplay(t, b, "k-lost", "pm_card_approve_lose_response", final)
	if a := b.audit(t, id); a.Approvals != 1 || a.Expiries != 0 {
		t.Errorf("audit %+v, want 1 approval, kept", a)
	}
	if b.api.Cards.Stats.Lookups.Load() == 0 {
		t.Error("no lookup counted")
	}
}

func TestLateAnswerIs202ThenSucceeded(t *testing.T) {
	t.Parallel()
	// The call outlasts the request's wait, not its own bound: its answer
	// resolves the charge. Recovery leaves it alone while it may answer.
	b := setup(t, cards.Options{Wait: 100 * time.Millisecond, CallTimeout: 3 * time.Second, DecisionDeadline: 6 * time.Second},
		"-late-delay", "1s")
	first := b.charge(t, "k-late", "pm_card_approve_answer_late")
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if a := b.audit(t, id); a.Approvals != 1 {
		t.Errorf("audit %+v", a)
	}
	if n := b.api.Cards.Stats.Lookups.Load(); n != 0 {
		t.Errorf("%d lookups while the call could still answer, want none", n)
	}
}

func TestSlowAnswerWithinTheWaitIs201(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 3 * time.Second})
	first := b.charge(t, "k-slow", "pm_card_slow")
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s, want 201", first.status, first.body)
	}
	requireReplay(t, b, "k-slow", "pm_card_slow", first)
}

func Test5xxAfterIsFoundByLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond})
	first := b.charge(t, "k-5xx-after", "pm_card_5xx_after")
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "succeeded", 10*time.Second)
	wantEvents(t, r, "charge.processing", "charge.succeeded")
	if a := b.audit(t, id); a.Approvals != 1 {
		t.Errorf("audit %+v, want 1 approval", a)
	}
}

func Test5xxBeforeIsRedrivenThenFailsPastTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, CallTimeout: 500 * time.Millisecond, DecisionDeadline: 2 * time.Second})
	first := b.charge(t, "k-5xx-before", "pm_card_5xx_before")
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	if r := b.rowsOf(t, id); r.status != "processing" {
		t.Fatalf("before the deadline the charge is %s, want processing", r.status)
	}
	r := b.waitFor(t, id, "failed", 10*time.Second)
	if r.failure != "processor-no-record" || r.keyStatus != http.StatusPaymentRequired {
		t.Errorf("rows %+v", r)
	}
	wantEvents(t, r, "charge.processing", "charge.failed")
	if b.api.Cards.Stats.Redrives.Load() == 0 {
		t.Error("no re-drive counted")
	}
	if a := b.audit(t, id); a.Approvals != 0 {
		t.Errorf("audit %+v, want nothing approved", a)
	}
	final := b.charge(t, "k-5xx-before", "pm_card_5xx_before")
	if final.status != http.StatusPaymentRequired || !bytes.Contains(final.body, []byte(`"code":"card-charge-failed"`)) {
		t.Errorf("retry: %d %s, want the stored 402 card-charge-failed", final.status, final.body)
	}

	// An approval announced after the charge failed, which the processor's
	// own records do not show (its lookup finds nothing: it never processed
	// the charge), is recorded and changes nothing: a webhook is confirmed
	// by a lookup before it moves money's state.
	lookups := b.api.Cards.Stats.Lookups.Load()
	late := b.signedEvent(t, "evt_late_"+id, id, "authorized")
	if a := b.postEvent(t, late); a.status != http.StatusOK {
		t.Fatalf("webhook: %d %s", a.status, a.body)
	}
	r = b.rowsOf(t, id)
	if r.status != "failed" || r.processorEvents != 1 || b.api.Cards.Stats.Lookups.Load() != lookups+1 {
		t.Errorf("after an unconfirmed approval: %+v, %d lookups (from %d); want still failed, the event recorded, one lookup",
			r, b.api.Cards.Stats.Lookups.Load(), lookups)
	}
	wantEvents(t, r, "charge.processing", "charge.failed")
	requireReplay(t, b, "k-5xx-before", "pm_card_5xx_before", final)
}

// TestAnsweredChargeTakesTwoConnections: a charge the processor answers
// within the wait takes a pooled connection twice, for its keyed write and
// for the transition that stores its response, which the call hands to the
// waiting request: no read of the response back. A capture likewise, with
// the read that tells a card charge's capture from an account charge's, and
// the confirmation round that read may take (postgres/confirmed.go): at
// most 4. The store's notifier takes one for each NOTIFY it sends after
// events commit (paced, asynchronous): the test listens and counts them
// apart.
func TestAnsweredChargeTakesTwoConnections(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Recovery runs once at its start, then not for an hour: nothing else
	// takes a connection while the test counts.
	b := setup(t, cards.Options{Interval: time.Hour})
	listener, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	if _, err := listener.Exec(ctx, "LISTEN payments_events"); err != nil {
		t.Fatal(err)
	}
	// notifies counts the NOTIFYs received until none came for 300 ms.
	notifies := func() int64 {
		var n int64
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return n
			}
			n++
		}
	}
	warm := b.charge(t, "k-warm", "pm_card_approve") // the API key is read, then cached
	if warm.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", warm.status, warm.body)
	}
	notifies()
	pool := b.api.Service.Pool()
	counted := func(name, path, key, body string, status int, most int64) answer {
		t.Helper()
		before := pool.Stat().AcquireCount()
		a := b.post(t, path, key, body)
		if a.status != status {
			t.Fatalf("%s: %d %s, want %d", name, a.status, a.body, status)
		}
		sent := notifies()
		if n := pool.Stat().AcquireCount() - before - sent; n > most {
			t.Errorf("%s: %d connections taken from the pool (and %d for NOTIFY), want at most %d", name, n, sent, most)
		}
		return a
	}
	auth := counted("authorization", "/v1/charges", "k-auth",
		`{"payment_method": "pm_card_approve", "amount": 1000, "currency": "EUR", "capture": false}`, http.StatusCreated, 2)
	counted("capture", "/v1/charges/"+chargeID(t, auth)+"/capture", "k-capture", `{}`, http.StatusOK, 4)
}
