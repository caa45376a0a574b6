package cards_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/cards"
)

// Captures, voids and refunds of card charges, through the API, on real
// PostgreSQL and the real simulator process: the answer, its replay byte for
// byte, the rows (the charge, its operations, its refunds, every event) and
// what the simulator did (its audit).

// settled sends body to path under key until its answer is no 202: a test
// whose wait is short may see an approval answered after it.
func (b *bundle) settled(t *testing.T, path, key, body string) answer {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := b.post(t, path, key, body)
		if a.status != http.StatusAccepted || time.Now().After(deadline) {
			return a
		}
	}
}

// authorize authorizes amount EUR with capture false under key and returns
// the charge's id.
func (b *bundle) authorize(t *testing.T, key string, amount int) string {
	t.Helper()
	a := b.settled(t, "/v1/charges", key, fmt.Sprintf(`{"payment_method": "pm_card_approve", "amount": %d, "currency": "EUR", "capture": false}`, amount))
	if a.status != http.StatusCreated || !bytes.Contains(a.body, []byte(`"status":"authorized"`)) {
		t.Fatalf("authorization: %d %s", a.status, a.body)
	}
	return chargeID(t, a)
}

// chargeCaptured charges amount EUR, captured at once, and returns its id.
func (b *bundle) chargeCaptured(t *testing.T, key string, amount int) string {
	t.Helper()
	a := b.settled(t, "/v1/charges", key, fmt.Sprintf(`{"payment_method": "pm_card_approve", "amount": %d, "currency": "EUR"}`, amount))
	if a.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", a.status, a.body)
	}
	return chargeID(t, a)
}

// ledger is what the tables hold about one charge and its operations.
type ledger struct {
	status                  string
	captured, refunded      int64
	ops                     []string // kind:state, oldest first
	refunds                 []string // amount:status, oldest first
	events                  []string // the merchant's, in order
	boundKeys, answeredKeys int
}

// ledgerOf reads it in one snapshot: a change committed between two of its
// statements would show half done (the operation succeeded, the charge not
// yet refunded).
func (b *bundle) ledgerOf(t *testing.T, id string) ledger {
	t.Helper()
	ctx := t.Context()
	var l ledger
	m, ch := b.api.MerchantID, uuidOf(t, id)
	tx, err := b.api.DB.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = tx.QueryRow(ctx, `SELECT status, amount_captured, amount_refunded FROM charges WHERE merchant_id = $1 AND id = $2`, m, ch).
		Scan(&l.status, &l.captured, &l.refunded)
	if err != nil {
		t.Fatal(err)
	}
	strs := func(sql string, args ...any) []string {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	l.ops = strs(`SELECT kind || ':' || state FROM processor_operations WHERE merchant_id = $1 AND charge_id = $2 ORDER BY created_at, kind`, m, ch)
	l.refunds = strs(`SELECT amount || ':' || status FROM refunds WHERE merchant_id = $1 AND charge_id = $2 ORDER BY created_at, amount`, m, ch)
	l.events = strs(`SELECT type FROM events WHERE merchant_id = $1 ORDER BY tx_id, seq`, m)
	err = tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status IS NULL), count(*) FILTER (WHERE status IS NOT NULL)
		FROM idempotency_keys WHERE merchant_id = $1 AND operation_id IS NOT NULL`, m).Scan(&l.boundKeys, &l.answeredKeys)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitOps waits up to limit for the charge's operations to be want.
func (b *bundle) waitOps(t *testing.T, id string, limit time.Duration, want ...string) ledger {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		l := b.ledgerOf(t, id)
		if slices.Equal(l.ops, want) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("operations %v after %s, want %v; service log:\n%s", l.ops, limit, want, b.api.Logs.Tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireSame sends body to path under key again and wants want's bytes
// back, marked as a replay.
func requireSame(t *testing.T, b *bundle, path, key, body string, want answer) {
	t.Helper()
	again := b.post(t, path, key, body)
	if again.status != want.status || !bytes.Equal(again.body, want.body) || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Location") != want.header.Get("Location") {
		t.Fatalf("replay of %s: %d %s (replayed %q), want %d %s byte for byte", path, again.status, again.body,
			again.header.Get("Idempotent-Replayed"), want.status, want.body)
	}
}

func requireLedger(t *testing.T, got ledger, status string, captured, refunded int64, ops, refunds, events []string) {
	t.Helper()
	if got.status != status || got.captured != captured || got.refunded != refunded || !slices.Equal(got.ops, ops) ||
		!slices.Equal(got.refunds, refunds) || !slices.Equal(got.events, events) {
		t.Errorf("ledger %+v,\nwant status %s, captured %d, refunded %d, operations %v, refunds %v, events %v",
			got, status, captured, refunded, ops, refunds, events)
	}
}

func TestCaptureOfAnAuthorization(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	for _, tc := range []struct {
		name, body string
		captured   int64
	}{
		{"whole", `{}`, 1000},
		{"partial", `{"amount": 600}`, 600},
	} {
		id := b.authorize(t, "k-auth-"+tc.name, 1000)
		path := "/v1/charges/" + id + "/capture"
		first := b.post(t, path, "k-capture-"+tc.name, tc.body)
		if first.status != http.StatusOK || !bytes.Contains(first.body, []byte(`"status":"succeeded"`)) ||
			!bytes.Contains(first.body, []byte(fmt.Sprintf(`"amount_captured":%d`, tc.captured))) {
			t.Fatalf("%s capture: %d %s, want 200 succeeded with amount_captured %d", tc.name, first.status, first.body, tc.captured)
		}
		requireSame(t, b, path, "k-capture-"+tc.name, tc.body, first)
		if got := b.get(t, "/v1/charges/"+id); !bytes.Equal(got.body, first.body) {
			t.Errorf("%s: GET %s, want the capture's answer %s", tc.name, got.body, first.body)
		}
		// Captured once: a second capture is refused, stored and replayed.
		again := b.post(t, path, "k-capture-again-"+tc.name, `{}`)
		if again.status != http.StatusConflict || !bytes.Contains(again.body, []byte(`"code":"charge-not-capturable"`)) ||
			!bytes.Contains(again.body, []byte(`"charge_status":"succeeded"`)) {
			t.Errorf("%s: second capture %d %s, want 409 charge-not-capturable", tc.name, again.status, again.body)
		}
		requireSame(t, b, path, "k-capture-again-"+tc.name, `{}`, again)
		if a := b.audit(t, id); a.Approvals != 1 || a.Captures != 1 || a.CapturedAmount != tc.captured {
			t.Errorf("%s: audit %+v, want 1 approval and 1 capture of %d", tc.name, a, tc.captured)
		}
		l := b.ledgerOf(t, id)
		requireLedger(t, l, "succeeded", tc.captured, 0, []string{"authorize:succeeded", "capture:succeeded"}, nil, l.events)
		if n := l.events[len(l.events)-3:]; !slices.Equal(n, []string{"charge.processing", "charge.authorized", "charge.captured"}) {
			t.Errorf("%s: events %v", tc.name, l.events)
		}
	}
	// The keys of the authorizations and the captures hold their final
	// responses; the refusals were stored with their keys, bound to none.
	if l := b.ledgerOf(t, b.authorize(t, "k-last", 1)); l.boundKeys != 0 || l.answeredKeys != 5 {
		t.Errorf("keys bound to operations: %d open, %d answered; want 0 and 5", l.boundKeys, l.answeredKeys)
	}
}

func TestVoidOfAnAuthorization(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	id := b.authorize(t, "k-auth", 800)
	path := "/v1/charges/" + id + "/void"
	first := b.post(t, path, "k-void", `{}`)
	if first.status != http.StatusOK || !bytes.Contains(first.body, []byte(`"status":"voided"`)) ||
		!bytes.Contains(first.body, []byte(`"amount_captured":0`)) {
		t.Fatalf("void: %d %s, want 200 voided", first.status, first.body)
	}
	requireSame(t, b, path, "k-void", `{}`, first)
	capture := b.post(t, "/v1/charges/"+id+"/capture", "k-capture", `{}`)
	if capture.status != http.StatusConflict || !bytes.Contains(capture.body, []byte(`"charge_status":"voided"`)) {
		t.Errorf("capture of a voided charge: %d %s, want 409 naming voided", capture.status, capture.body)
	}
	if a := b.audit(t, id); a.Approvals != 1 || a.Voids != 1 || a.Captures != 0 {
		t.Errorf("audit %+v, want 1 approval and 1 void", a)
	}
	requireLedger(t, b.ledgerOf(t, id), "voided", 0, 0, []string{"authorize:succeeded", "void:succeeded"}, nil,
		[]string{"charge.processing", "charge.authorized", "charge.voided"})
}

func TestRefundsFullAndPartial(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	id := b.chargeCaptured(t, "k-charge", 1000)
	path := "/v1/charges/" + id + "/refunds"
	part := b.post(t, path, "k-refund-1", `{"amount": 300}`)
	if part.status != http.StatusCreated || !bytes.Contains(part.body, []byte(`"status":"succeeded"`)) ||
		!bytes.Contains(part.body, []byte(`"amount":300`)) || !strings.HasPrefix(part.header.Get("Location"), "/v1/charges/"+id+"/refunds/re_") {
		t.Fatalf("refund 300: %d %v %s", part.status, part.header, part.body)
	}
	requireSame(t, b, path, "k-refund-1", `{"amount": 300}`, part)
	if got := b.get(t, part.header.Get("Location")); got.status != http.StatusOK || !bytes.Equal(got.body, part.body) {
		t.Errorf("GET refund: %d %s, want %s", got.status, got.body, part.body)
	}
	rest := b.post(t, path, "k-refund-2", `{}`)
	if rest.status != http.StatusCreated || !bytes.Contains(rest.body, []byte(`"amount":700`)) {
		t.Fatalf("refund the rest: %d %s, want 201 of 700", rest.status, rest.body)
	}
	more := b.post(t, path, "k-refund-3", `{"amount": 1}`)
	if more.status != http.StatusUnprocessableEntity || !bytes.Contains(more.body, []byte(`"code":"refund-exceeds-charge"`)) {
		t.Fatalf("refund past the charge: %d %s, want 422 refund-exceeds-charge", more.status, more.body)
	}
	requireSame(t, b, path, "k-refund-3", `{"amount": 1}`, more)
	if a := b.audit(t, id); a.Approvals != 1 || a.Refunds != 2 || a.RefundedAmount != 1000 {
		t.Errorf("audit %+v, want 2 refunds of 1000 in all", a)
	}
	requireLedger(t, b.ledgerOf(t, id), "succeeded", 1000, 1000,
		[]string{"authorize:succeeded", "refund:succeeded", "refund:succeeded"}, []string{"300:succeeded", "700:succeeded"},
		[]string{"charge.processing", "charge.succeeded", "refund.created", "refund.created"})
	var c struct {
		Refunded int64 `json:"amount_refunded"`
	}
	if got := b.get(t, "/v1/charges/"+id); json.Unmarshal(got.body, &c) != nil || c.Refunded != 1000 {
		t.Errorf("GET charge: %s, want amount_refunded 1000", got.body)
	}
}

func TestRefundsRacingForTheLastAmountOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	id := b.chargeCaptured(t, "k-charge", 1000)
	path := "/v1/charges/" + id + "/refunds"
	if a := b.post(t, path, "k-first", `{"amount": 600}`); a.status != http.StatusCreated {
		t.Fatalf("refund 600: %d %s", a.status, a.body)
	}
	const n = 8
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		answers = make([]answer, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = b.post(t, path, fmt.Sprintf("k-race-%d", i), `{"amount": 400}`)
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			won++
		case a.status == http.StatusUnprocessableEntity && bytes.Contains(a.body, []byte(`"code":"refund-exceeds-charge"`)):
		default:
			t.Errorf("racing refund: %d %s", a.status, a.body)
		}
	}
	if won != 1 {
		t.Fatalf("%d racing refunds won, want exactly 1", won)
	}
	if a := b.audit(t, id); a.Refunds != 2 || a.RefundedAmount != 1000 {
		t.Errorf("audit %+v, want 2 refunds of 1000 in all", a)
	}
	requireLedger(t, b.ledgerOf(t, id), "succeeded", 1000, 1000,
		[]string{"authorize:succeeded", "refund:succeeded", "refund:succeeded"}, []string{"600:succeeded", "400:succeeded"},
		[]string{"charge.processing", "charge.succeeded", "refund.created", "refund.created"})
}

func TestLostCaptureAnswerIs202ThenRecovered(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, Backoff: 300 * time.Millisecond})
	id := b.authorize(t, "k-auth", 1000)
	b.proxy.loseFollowUps.Store(true)
	path := "/v1/charges/" + id + "/capture"
	first := b.post(t, path, "k-capture", `{"amount": 900}`)
	if first.status != http.StatusAccepted || first.header.Get("Retry-After") == "" || first.header.Get("Location") != "/v1/charges/"+id ||
		!bytes.Contains(first.body, []byte(`"status":"authorized"`)) {
		t.Fatalf("capture: %d %v %s, want 202 with the charge still authorized", first.status, first.header, first.body)
	}
	// While it is in flight, a void is refused: the capture's outcome
	// decides what the charge is.
	void := b.post(t, "/v1/charges/"+id+"/void", "k-void", `{}`)
	if void.status != http.StatusConflict || !bytes.Contains(void.body, []byte(`"code":"charge-operation-in-progress"`)) {
		t.Errorf("void while the capture is in flight: %d %s, want 409 charge-operation-in-progress", void.status, void.body)
	}
	requireSame(t, b, "/v1/charges/"+id+"/void", "k-void", `{}`, void)
	l := b.waitOps(t, id, 10*time.Second, "authorize:succeeded", "capture:succeeded")
	requireLedger(t, l, "succeeded", 900, 0, l.ops, nil, []string{"charge.processing", "charge.authorized", "charge.captured"})
	final := b.post(t, path, "k-capture", `{"amount": 900}`)
	if final.status != http.StatusOK || final.header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(final.body, []byte(`"amount_captured":900`)) {
		t.Fatalf("retry: %d %s, want the stored 200", final.status, final.body)
	}
	requireSame(t, b, path, "k-capture", `{"amount": 900}`, final)
	if a := b.audit(t, id); a.Approvals != 1 || a.Captures != 1 || a.CapturedAmount != 900 || a.Voids != 0 {
		t.Errorf("audit %+v, want 1 capture of 900", a)
	}
	if b.api.Cards.Stats.Lookups.Load() == 0 {
		t.Error("no lookup counted")
	}
}

func TestLostRefundAnswerIsRedrivenAndARetryNeverCallsAgain(t *testing.T) {
	t.Parallel()
	// Checks far apart: the retry under the key waits for the outcome
	// while the operation is open, and never calls the processor.
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, Backoff: 2 * time.Second, MaxBackoff: 2 * time.Second})
	id := b.chargeCaptured(t, "k-charge", 1000)
	b.proxy.loseFollowUps.Store(true)
	path := "/v1/charges/" + id + "/refunds"
	first := b.post(t, path, "k-refund", `{"amount": 250}`)
	if first.status != http.StatusAccepted || !bytes.Contains(first.body, []byte(`"status":"pending"`)) ||
		!strings.HasPrefix(first.header.Get("Location"), "/v1/charges/"+id+"/refunds/re_") {
		t.Fatalf("refund: %d %v %s, want 202 pending", first.status, first.header, first.body)
	}
	// Its amount is reserved: what is left is 750.
	if a := b.post(t, path, "k-too-much", `{"amount": 751}`); a.status != http.StatusUnprocessableEntity {
		t.Errorf("a refund of more than what is left while one is pending: %d %s, want 422", a.status, a.body)
	}
	retry := b.post(t, path, "k-refund", `{"amount": 250}`)
	if retry.status != http.StatusAccepted && retry.status != http.StatusCreated {
		t.Fatalf("retry: %d %s", retry.status, retry.body)
	}
	if a := b.audit(t, id); a.Refunds != 1 {
		t.Errorf("audit %+v after a retry, want the one refund", a)
	}
	b.proxy.loseFollowUps.Store(false)
	l := b.waitOps(t, id, 10*time.Second, "authorize:succeeded", "refund:succeeded")
	requireLedger(t, l, "succeeded", 1000, 250, l.ops, []string{"250:succeeded"},
		[]string{"charge.processing", "charge.succeeded", "refund.created"})
	final := b.post(t, path, "k-refund", `{"amount": 250}`)
	if final.status != http.StatusCreated || final.header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(final.body, []byte(`"status":"succeeded"`)) {
		t.Fatalf("retry once recovered: %d %s, want the stored 201", final.status, final.body)
	}
	if a := b.audit(t, id); a.Refunds != 1 || a.RefundedAmount != 250 {
		t.Errorf("audit %+v, want 1 refund of 250 (the re-drive answered from the first)", a)
	}
	if b.api.Cards.Stats.Redrives.Load() == 0 {
		t.Error("no re-drive counted")
	}
}

func TestRefusalsAreStoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond})
	authorized := b.authorize(t, "k-auth", 500)
	captured := b.chargeCaptured(t, "k-charge", 500)
	processing := chargeID(t, b.charge(t, "k-processing", "pm_card_5xx_before"))
	for _, tc := range []struct {
		name, path, body, status string
		code                     int
	}{
		{"capture of a captured charge", "/v1/charges/" + captured + "/capture", `{}`, `"code":"charge-not-capturable"`, 409},
		{"void of a captured charge", "/v1/charges/" + captured + "/void", `{}`, `"code":"charge-not-voidable"`, 409},
		{"refund of an authorization", "/v1/charges/" + authorized + "/refunds", `{}`, `"code":"charge-not-refundable"`, 409},
		{"capture over the authorization", "/v1/charges/" + authorized + "/capture", `{"amount": 501}`, `"code":"capture-exceeds-authorization"`, 422},
		{"refund over the charge", "/v1/charges/" + captured + "/refunds", `{"amount": 501}`, `"code":"refund-exceeds-charge"`, 422},
		{"capture of a charge processing", "/v1/charges/" + processing + "/capture", `{}`, `"charge_status":"processing"`, 409},
		{"refund of a charge processing", "/v1/charges/" + processing + "/refunds", `{}`, `is processing at the card processor`, 409},
	} {
		key := "k-" + strings.ReplaceAll(tc.name, " ", "-")
		first := b.post(t, tc.path, key, tc.body)
		if first.status != tc.code || !bytes.Contains(first.body, []byte(tc.status)) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, first.status, first.body, tc.code, tc.status)
			continue
		}
		requireSame(t, b, tc.path, key, tc.body, first)
	}
	for _, id := range []string{authorized, captured} {
		if a := b.audit(t, id); a.Captures > 1 || a.Voids != 0 || a.Refunds != 0 {
			t.Errorf("%s: audit %+v, want nothing done after the authorization", id, a)
		}
		if l := b.ledgerOf(t, id); len(l.ops) != 1 || len(l.refunds) != 0 {
			t.Errorf("%s: %+v, want no operation but the authorization", id, l)
		}
	}
}

func TestProcessorDeclineLeavesTheChargeAsItWas(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	// The payments change at the processor behind the service's back, so
	// that it refuses what the service asks (invalid_state).
	behind := func(id, op string) {
		t.Helper()
		var psp string
		if err := b.api.DB.QueryRow(t.Context(), `SELECT psp_reference FROM charges WHERE merchant_id = $1 AND id = $2`,
			b.api.MerchantID, uuidOf(t, id)).Scan(&psp); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, b.sim.URL()+"/v1/payments/"+psp+"/"+op, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "behind-"+id)
		req.Header.Set("Content-Type", "application/json")
		if a := b.do(t, req); a.status != http.StatusOK {
			t.Fatalf("%s at the simulator: %d %s", op, a.status, a.body)
		}
	}
	authorized := b.authorize(t, "k-auth", 500)
	behind(authorized, "voids")
	path := "/v1/charges/" + authorized + "/capture"
	first := b.post(t, path, "k-capture", `{}`)
	if first.status != http.StatusConflict || !bytes.Contains(first.body, []byte(`"code":"processor-declined"`)) ||
		!bytes.Contains(first.body, []byte(`"decline_code":"invalid_state"`)) {
		t.Fatalf("capture the processor refuses: %d %s, want 409 processor-declined naming invalid_state", first.status, first.body)
	}
	requireSame(t, b, path, "k-capture", `{}`, first)
	requireLedger(t, b.ledgerOf(t, authorized), "authorized", 0, 0, []string{"authorize:succeeded", "capture:failed"}, nil,
		[]string{"charge.processing", "charge.authorized"})

	captured := b.chargeCaptured(t, "k-charge", 500)
	behind(captured, "refunds")
	refund := b.post(t, "/v1/charges/"+captured+"/refunds", "k-refund", `{"amount": 100}`)
	if refund.status != http.StatusConflict || !bytes.Contains(refund.body, []byte(`"code":"processor-declined"`)) {
		t.Fatalf("refund the processor refuses: %d %s, want 409 processor-declined", refund.status, refund.body)
	}
	l := b.ledgerOf(t, captured)
	requireLedger(t, l, "succeeded", 500, 0, []string{"authorize:succeeded", "refund:failed"}, []string{"100:failed"}, l.events)
	if a := b.audit(t, captured); a.Refunds != 1 {
		t.Errorf("audit %+v, want only the refund made behind the service's back", a)
	}
}

func TestCaptureUnknownPastReviewAfterGoesToReview(t *testing.T) {
	t.Parallel()
	// Every answer of the capture is lost and every lookup fails: recovery
	// sends it again with its key until ReviewAfter, then an operator
	// decides. Nothing is reversed: the merchant asked for the capture.
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, CallTimeout: 500 * time.Millisecond, ReviewAfter: 1500 * time.Millisecond})
	id := b.authorize(t, "k-auth", 1000)
	b.proxy.loseFollowUps.Store(true)
	b.proxy.failLookups.Store(true)
	path := "/v1/charges/" + id + "/capture"
	if a := b.post(t, path, "k-capture", `{}`); a.status != http.StatusAccepted {
		t.Fatalf("capture: %d %s, want 202", a.status, a.body)
	}
	l := b.waitOps(t, id, 10*time.Second, "authorize:succeeded", "capture:requires_review")
	requireLedger(t, l, "authorized", 0, 0, l.ops, nil, []string{"charge.processing", "charge.authorized"})
	if l.boundKeys != 1 {
		t.Errorf("%d keys bound, want the capture's", l.boundKeys)
	}
	if n := b.api.Cards.Stats.Reviews.Load(); n != 1 {
		t.Errorf("%d reviews counted, want 1", n)
	}
	// The key stays bound: a retry answers the charge as it stands, and a
	// void is refused while the capture is in review.
	again := b.post(t, path, "k-capture", `{}`)
	if again.status != http.StatusAccepted || !bytes.Contains(again.body, []byte(`"status":"authorized"`)) {
		t.Errorf("retry: %d %s, want 202 with the charge as it stands", again.status, again.body)
	}
	if a := b.post(t, "/v1/charges/"+id+"/void", "k-void", `{}`); a.status != http.StatusConflict ||
		!bytes.Contains(a.body, []byte(`"code":"charge-operation-in-progress"`)) {
		t.Errorf("void while the capture is in review: %d %s, want 409 charge-operation-in-progress", a.status, a.body)
	}
	if a := b.audit(t, id); a.Captures != 1 || a.Voids != 0 {
		t.Errorf("audit %+v, want the one capture (its re-drives answered from it)", a)
	}
	if b.api.Cards.Stats.Redrives.Load() == 0 {
		t.Error("no re-drive counted")
	}
}
