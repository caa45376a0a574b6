package cards_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/payment"
)

// inReview charges pm (the body's other fields: extra) under key while the
// processor's answers are lost and its lookups and reversals refused, and
// returns the charge once recovery has sent it to requires_review.
func (b *bundle) inReview(t *testing.T, key, pm, extra string) string {
	t.Helper()
	b.proxy.loseAuthorizations.Store(true)
	b.proxy.failLookups.Store(true)
	b.proxy.failReverses.Store(true)
	first := b.post(t, "/v1/charges", key, `{"payment_method": "`+pm+`", "amount": 1000, "currency": "EUR"`+extra+`}`)
	if first.status != http.StatusAccepted {
		t.Fatalf("charge: %d %s, want 202", first.status, first.body)
	}
	id := chargeID(t, first)
	r := b.waitFor(t, id, "requires_review", 20*time.Second)
	wantEvents(t, r, "charge.processing", "charge.reversing", "charge.requires_review")
	return id
}

// resolution is an audit row of a resolution.
type resolution struct {
	from, as, status, reason, operator string
	at                                 time.Time
}

// resolutions reads the audit of the charge id's resolutions, oldest first.
func (b *bundle) resolutions(t *testing.T, id string) []resolution {
	t.Helper()
	rows, err := b.api.DB.Query(context.Background(), `
SELECT from_state, resolved_as, status, reason, operator, resolved_at FROM charge_resolutions
WHERE merchant_id = $1 AND charge_id = $2 ORDER BY resolved_at`, b.api.MerchantID, uuidOf(t, id))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var found []resolution
	for rows.Next() {
		var r resolution
		if err := rows.Scan(&r.from, &r.as, &r.status, &r.reason, &r.operator, &r.at); err != nil {
			t.Fatal(err)
		}
		found = append(found, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return found
}

// keyRow is the stored response of the key bound to the charge id: its
// status (0 while bound) and body.
func (b *bundle) keyRow(t *testing.T, id string) (int, []byte) {
	t.Helper()
	var status *int32
	var body []byte
	if err := b.api.DB.QueryRow(context.Background(), `SELECT status, body FROM idempotency_keys WHERE merchant_id = $1 AND operation_id = $2`,
		b.api.MerchantID, uuidOf(t, id)).Scan(&status, &body); err != nil {
		t.Fatal(err)
	}
	if status == nil {
		return 0, body
	}
	return int(*status), body
}

func settlement(t *testing.T, id string, as payment.ChargeStatus) cards.Settlement {
	return cards.Settlement{Charge: uuidOf(t, id), As: as, Reason: "procsim audit: no approval under the reference", Operator: "alice"}
}

// TestResolveAsFailed: a charge in review that the processor never
// processed (its audit has no approval) settled as failed by an operator:
// failed with its own failure code, one charge.failed event, the key's 402
// now stored and replayed byte for byte, and the audit's row. Of resolutions
// racing, one wins; later ones, and bad ones, refuse and change nothing.
func TestResolveAsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{Wait: 50 * time.Millisecond, CallTimeout: 500 * time.Millisecond, DecisionDeadline: 2 * time.Second})
	const key, pm = "k-resolve-failed", "pm_card_5xx_before"
	id := b.inReview(t, key, pm, "")
	ctx := context.Background()

	// The evidence: the processor approved nothing under the reference.
	if a := b.audit(t, id); a.Approvals != 0 {
		t.Fatalf("simulator's audit %+v, want no approval", a)
	}
	// Bad settlements refuse before anything is read or written.
	for _, bad := range []cards.Settlement{
		{Charge: uuidOf(t, id), As: payment.ChargeFailed, Reason: "", Operator: "alice"},
		{Charge: uuidOf(t, id), As: payment.ChargeFailed, Reason: " \t\n", Operator: "alice"},
		{Charge: uuidOf(t, id), As: payment.ChargeFailed, Reason: strings.Repeat("x", cards.MaxReasonLength+1), Operator: "alice"},
		{Charge: uuidOf(t, id), As: payment.ChargeFailed, Reason: "expired", Operator: ""},
		{Charge: uuidOf(t, id), As: payment.ChargeFailed, Reason: "expired", Operator: strings.Repeat("o", cards.MaxOperatorLength+1)},
		{Charge: uuidOf(t, id), As: payment.ChargeAuthorized, Reason: "expired", Operator: "alice"},
		{Charge: uuidOf(t, id), As: payment.ChargeReversed, Reason: "expired", Operator: "alice"},
	} {
		var invalid *payment.ValidationError
		if _, err := b.api.Cards.Resolve(ctx, bad); !errors.As(err, &invalid) {
			t.Errorf("Resolve(as %q, reason %.10q, operator %.10q) = %v, want a validation error", bad.As, bad.Reason, bad.Operator, err)
		}
	}
	if r := b.rowsOf(t, id); r.status != "requires_review" || len(r.events) != 3 || r.keyStatus != 0 || len(b.resolutions(t, id)) != 0 {
		t.Fatalf("after refused settlements: %+v, %d resolutions; want nothing changed", r, len(b.resolutions(t, id)))
	}

	// Eight operators at once (a barrier): one settles it, the others are
	// told its new status.
	const n = 8
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		errs  = make([]error, n)
		got   = make([]payment.Charge, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = b.api.Cards.Resolve(ctx, settlement(t, id, payment.ChargeFailed))
		}()
	}
	close(start)
	wg.Wait()
	var settled payment.Charge
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
			settled = got[i]
		case !errors.Is(err, cards.ErrNotInReview) || !strings.Contains(err.Error(), "failed"):
			t.Errorf("a losing Resolve: %v, want ErrNotInReview naming the status failed", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d resolutions won, want 1", wins)
	}
	if settled.Status != payment.ChargeFailed || settled.FailureCode != payment.FailureOperatorResolved || settled.DeclineCode != "" ||
		settled.AmountCaptured != 0 || payment.FormatID(payment.PrefixCharge, settled.ID) != id {
		t.Errorf("Resolve returned %+v, want the charge failed (operator-resolved)", settled)
	}
	r := b.rowsOf(t, id)
	wantEvents(t, r, "charge.processing", "charge.reversing", "charge.requires_review", "charge.failed")
	if r.status != "failed" || r.failure != payment.FailureOperatorResolved || r.opState != "failed" || r.keyStatus != http.StatusPaymentRequired {
		t.Errorf("rows %+v, want failed (operator-resolved), its operation failed, its key answered 402", r)
	}
	res := b.resolutions(t, id)
	if len(res) != 1 || res[0].from != "requires_review" || res[0].as != "failed" || res[0].status != "failed" ||
		res[0].operator != "alice" || res[0].reason != "procsim audit: no approval under the reference" || res[0].at.IsZero() {
		t.Errorf("audit rows %+v, want one: requires_review to failed by alice, with the reason", res)
	}
	var resolvedAt time.Time
	if err := b.api.DB.QueryRow(ctx, `SELECT resolved_at FROM processor_operations WHERE id = $1`, uuidOf(t, id)).Scan(&resolvedAt); err != nil ||
		len(res) == 1 && !resolvedAt.Equal(res[0].at) {
		t.Errorf("the operation was resolved at %s (%v), its audit row says %v: want one clock", resolvedAt, err, res)
	}

	// The key's retry now answers the 402, stored, and replays it.
	final := b.charge(t, key, pm)
	if final.status != http.StatusPaymentRequired || !bytes.Contains(final.body, []byte(`"code":"card-charge-failed"`)) ||
		!bytes.Contains(final.body, []byte(`"charge_id":"`+id+`"`)) {
		t.Fatalf("retry: %d %s, want the stored 402 card-charge-failed", final.status, final.body)
	}
	if _, body := b.keyRow(t, id); !bytes.Equal(body, final.body) {
		t.Errorf("the retry answered %s, the key stores %s", final.body, body)
	}
	requireReplay(t, b, key, pm, final)
	if got := b.get(t, "/v1/charges/"+id); !bytes.Contains(got.body, []byte(`"failure_code":"operator-resolved"`)) {
		t.Errorf("GET: %d %s, want failure_code operator-resolved", got.status, got.body)
	}

	// Twice: refused, naming the status; nothing changes.
	if _, err := b.api.Cards.Resolve(ctx, settlement(t, id, payment.ChargeSucceeded)); !errors.Is(err, cards.ErrNotInReview) ||
		!strings.Contains(err.Error(), "failed") {
		t.Errorf("a second Resolve: %v, want ErrNotInReview naming the status failed", err)
	}
	if again := b.rowsOf(t, id); again.status != "failed" || len(again.events) != 4 || len(b.resolutions(t, id)) != 1 {
		t.Errorf("after a second resolution: %+v, want nothing changed", again)
	}
	if a := b.audit(t, id); a.Approvals != 0 || a.Reversals != 0 {
		t.Errorf("simulator's audit %+v: resolving calls no processor", a)
	}
}

// TestResolveAsSucceeded: a charge in review that the processor kept (its
// audit shows the approval, delivered (to the proxy that lost it) and so
// not expired) settled as succeeded: succeeded (or authorized, the charge's capture
// flag says which) with its event, and the key's 201 stored and replayed.
func TestResolveAsSucceeded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, extra, status, event string
		captured                   int64
	}{
		{"capture", "", "succeeded", "charge.succeeded", 1000},
		{"authorize only", `, "capture": false`, "authorized", "charge.authorized", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, cards.Options{Wait: 50 * time.Millisecond, CallTimeout: 500 * time.Millisecond, DecisionDeadline: 2 * time.Second})
			key := "k-resolve-" + tc.status
			id := b.inReview(t, key, "pm_card_approve", tc.extra)
			if a := b.audit(t, id); a.Approvals != 1 || a.Expiries != 0 {
				t.Fatalf("simulator's audit %+v, want the approval kept", a)
			}
			s := settlement(t, id, payment.ChargeSucceeded)
			s.Reason = "procsim audit: approved 1000 EUR, kept"
			settled, err := b.api.Cards.Resolve(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			if string(settled.Status) != tc.status || settled.AmountCaptured != tc.captured || settled.FailureCode != "" {
				t.Errorf("Resolve returned %+v, want %s with %d captured", settled, tc.status, tc.captured)
			}
			r := b.rowsOf(t, id)
			wantEvents(t, r, "charge.processing", "charge.reversing", "charge.requires_review", tc.event)
			if r.status != tc.status || r.opState != "succeeded" || r.keyStatus != http.StatusCreated {
				t.Errorf("rows %+v, want %s, its operation succeeded, its key answered 201", r, tc.status)
			}
			if res := b.resolutions(t, id); len(res) != 1 || res[0].as != "succeeded" || res[0].status != tc.status || res[0].reason != s.Reason {
				t.Errorf("audit rows %+v", res)
			}
			final := b.post(t, "/v1/charges", key, `{"payment_method": "pm_card_approve", "amount": 1000, "currency": "EUR"`+tc.extra+`}`)
			if final.status != http.StatusCreated || !bytes.Contains(final.body, []byte(`"status":"`+tc.status+`"`)) ||
				final.header.Get("Location") != "/v1/charges/"+id {
				t.Fatalf("retry: %d %s, want the stored 201", final.status, final.body)
			}
			again := b.post(t, "/v1/charges", key, `{"payment_method": "pm_card_approve", "amount": 1000, "currency": "EUR"`+tc.extra+`}`)
			if again.status != final.status || !bytes.Equal(again.body, final.body) || again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("replay: %d %s, want %d %s byte for byte", again.status, again.body, final.status, final.body)
			}
			if got := b.get(t, "/v1/charges/"+id); !bytes.Equal(bytes.TrimSpace(got.body), bytes.TrimSpace(final.body)) {
				t.Errorf("GET %s, the key's 201 %s: want the same charge", got.body, final.body)
			}
		})
	}
}

// TestResolveRefusesAChargeNotInReview: a charge that is not in review, and
// one that does not exist, refuse; nothing changes.
func TestResolveRefusesAChargeNotInReview(t *testing.T) {
	t.Parallel()
	b := setup(t, cards.Options{})
	first := b.charge(t, "k-not-in-review", "pm_card_approve")
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.status, first.body)
	}
	id := chargeID(t, first)
	before := b.rowsOf(t, id)
	status, body := b.keyRow(t, id)
	_, err := b.api.Cards.Resolve(context.Background(), settlement(t, id, payment.ChargeFailed))
	if !errors.Is(err, cards.ErrNotInReview) || !strings.Contains(err.Error(), "succeeded") || !strings.Contains(err.Error(), id) {
		t.Errorf("Resolve = %v, want ErrNotInReview naming the charge and its status succeeded", err)
	}
	after := b.rowsOf(t, id)
	wantEvents(t, after, before.events...)
	if after.status != "succeeded" || after.opState != before.opState || len(b.resolutions(t, id)) != 0 {
		t.Errorf("rows %+v, want nothing changed", after)
	}
	if s, bd := b.keyRow(t, id); s != status || !bytes.Equal(bd, body) {
		t.Errorf("the key's response changed: %d %s, was %d %s", s, bd, status, body)
	}
	requireReplay(t, b, "k-not-in-review", "pm_card_approve", first)

	unknown := settlement(t, id, payment.ChargeFailed)
	unknown.Charge = payment.NewID()
	if _, err := b.api.Cards.Resolve(context.Background(), unknown); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("Resolve of an unknown charge = %v, want payment.ErrNotFound", err)
	}
}
