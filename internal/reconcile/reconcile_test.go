package reconcile_test

import (
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/reconcile"
)

var (
	since = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	until = since.Add(24 * time.Hour)
	now   = until.Add(5 * time.Minute)
	in    = since.Add(time.Hour) // inside the window
)

// op is our authorization "ch_1" of 1000 EUR, created in the window, settled
// with status and the captured and refunded amounts.
func op(status payment.ChargeStatus, captured, refunded int64) *reconcile.Operation {
	state := map[payment.ChargeStatus]string{payment.ChargeSucceeded: "succeeded", payment.ChargeAuthorized: "succeeded",
		payment.ChargeVoided: "succeeded", payment.ChargeFailed: "failed", payment.ChargeReversed: "reversed",
		payment.ChargeProcessing: "processing", payment.ChargeRequiresReview: "requires_review"}[status]
	return &reconcile.Operation{Reference: "ch_1", State: state, Status: status, Amount: 1000, AmountCaptured: captured,
		AmountRefunded: refunded, Currency: "EUR", CreatedAt: in}
}

// pay is the processor's payment psp_a under ch_1 with status and the
// approved, captured and refunded amounts.
func pay(status string, approved, captured, refunded int64) processor.Payment {
	return processor.Payment{PSPReference: "psp_a", Reference: "ch_1", Status: status, Amount: 1000, Currency: "EUR",
		ApprovedAmount: approved, CapturedAmount: captured, RefundedAmount: refunded, Created: in.Add(time.Second)}
}

func with(o *reconcile.Operation, f func(*reconcile.Operation)) *reconcile.Operation {
	f(o)
	return o
}

func also(p processor.Payment, f func(*processor.Payment)) processor.Payment {
	f(&p)
	return p
}

// TestCompare judges one reference per case: what agrees, what is pending,
// and what each kind of disagreement says.
func TestCompare(t *testing.T) {
	t.Parallel()
	second := also(pay("captured", 1000, 1000, 0), func(p *processor.Payment) { p.PSPReference = "psp_b" })
	cases := []struct {
		name   string
		ours   *reconcile.Operation
		theirs []processor.Payment
		want   reconcile.Result
		detail string
	}{
		{"captured", op(payment.ChargeSucceeded, 1000, 0), []processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.Matched, ""},
		{"partly captured, partly refunded", op(payment.ChargeSucceeded, 600, 100), []processor.Payment{pay("captured", 1000, 600, 100)}, reconcile.Matched, ""},
		{"refunded in full", op(payment.ChargeSucceeded, 1000, 1000), []processor.Payment{pay("captured", 1000, 1000, 1000)}, reconcile.Matched, ""},
		{"a processor's refunded status", op(payment.ChargeSucceeded, 1000, 1000), []processor.Payment{pay("refunded", 1000, 1000, 1000)}, reconcile.Matched, ""},
		{"a decline before the approval", op(payment.ChargeSucceeded, 1000, 0),
			[]processor.Payment{also(pay("declined", 0, 0, 0), func(p *processor.Payment) { p.PSPReference = "psp_0" }), pay("captured", 1000, 1000, 0)}, reconcile.Matched, ""},
		{"authorized", op(payment.ChargeAuthorized, 0, 0), []processor.Payment{pay("authorized", 1000, 0, 0)}, reconcile.Matched, ""},
		{"failed, never reached", op(payment.ChargeFailed, 0, 0), nil, reconcile.Matched, ""},
		{"failed, declined", op(payment.ChargeFailed, 0, 0), []processor.Payment{pay("declined", 0, 0, 0)}, reconcile.Matched, ""},
		{"failed, expired at the deadline", op(payment.ChargeFailed, 0, 0), []processor.Payment{pay("expired", 1000, 1000, 1000)}, reconcile.Matched, ""},
		{"reversed", op(payment.ChargeReversed, 0, 0), []processor.Payment{pay("reversed", 1000, 1000, 1000)}, reconcile.Matched, ""},
		{"voided", op(payment.ChargeVoided, 0, 0), []processor.Payment{pay("voided", 1000, 0, 0)}, reconcile.Matched, ""},

		{"processing", op(payment.ChargeProcessing, 0, 0), nil, reconcile.Pending, "our operation is processing"},
		{"in review", op(payment.ChargeRequiresReview, 0, 0), []processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.Pending,
			"in review (payments charges resolve)"},
		{"a refund in flight", with(op(payment.ChargeSucceeded, 1000, 0), func(o *reconcile.Operation) { o.OpenFollowUps = 1 }),
			[]processor.Payment{pay("captured", 1000, 1000, 400)}, reconcile.Pending, "1 capture, void or refund of the charge still open"},
		{"younger than the settle margin", with(op(payment.ChargeSucceeded, 1000, 0), func(o *reconcile.Operation) { o.CreatedAt = until.Add(-time.Minute) }),
			nil, reconcile.Pending, "changed within the settle margin"},
		{"a refund within the settle margin", with(op(payment.ChargeSucceeded, 1000, 0), func(o *reconcile.Operation) { o.ChangedAt = until.Add(-time.Minute) }),
			[]processor.Payment{pay("captured", 1000, 1000, 300)}, reconcile.Pending, "changed within the settle margin"},
		{"the processor deciding", op(payment.ChargeFailed, 0, 0), []processor.Payment{pay("pending", 0, 0, 0)}, reconcile.Pending,
			"the processor has not decided yet"},

		{"succeeded, no payment", op(payment.ChargeSucceeded, 1000, 0), nil, reconcile.MissingAtProcessor,
			"ours is succeeded, the processor has no payment under this reference"},
		{"voided, no payment", op(payment.ChargeVoided, 0, 0), nil, reconcile.MissingAtProcessor,
			"ours is voided, the processor has no payment under this reference"},
		{"captured amount", op(payment.ChargeSucceeded, 900, 0), []processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.AmountMismatch,
			"captured 900 here, 1000 at the processor"},
		{"refunded amount", op(payment.ChargeSucceeded, 1000, 0), []processor.Payment{pay("captured", 1000, 1000, 300)}, reconcile.AmountMismatch,
			"refunded 0 here, 300 at the processor"},
		{"charge amount", with(op(payment.ChargeSucceeded, 1000, 0), func(o *reconcile.Operation) { o.Amount = 1200 }),
			[]processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.AmountMismatch,
			"amount 1200 here, 1000 at the processor; approved 1200 here, 1000 at the processor"},
		{"currency", op(payment.ChargeSucceeded, 1000, 0), []processor.Payment{also(pay("captured", 1000, 1000, 0), func(p *processor.Payment) { p.Currency = "USD" })},
			reconcile.AmountMismatch, "currency EUR here, USD at the processor"},
		{"succeeded, expired there", op(payment.ChargeSucceeded, 1000, 0), []processor.Payment{pay("expired", 1000, 1000, 1000)}, reconcile.StateMismatch,
			"ours is succeeded, the processor has psp_a expired 1000/1000/1000"},
		{"succeeded, only authorized there", op(payment.ChargeSucceeded, 1000, 0), []processor.Payment{pay("authorized", 1000, 0, 0)}, reconcile.StateMismatch,
			"ours is succeeded, the processor has psp_a authorized 1000/0/0"},
		{"charged twice", op(payment.ChargeSucceeded, 1000, 0), []processor.Payment{pay("captured", 1000, 1000, 0), second}, reconcile.StateMismatch,
			"ours is succeeded, the processor has psp_a captured 1000/1000/0, psp_b captured 1000/1000/0"},
		{"authorized, captured there", op(payment.ChargeAuthorized, 0, 0), []processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.StateMismatch,
			"ours is authorized, the processor has psp_a captured 1000/1000/0"},
		{"failed, captured there", op(payment.ChargeFailed, 0, 0), []processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.StateMismatch,
			"ours is failed, the processor holds 0 and keeps 1000: psp_a captured 1000/1000/0"},
		{"reversed, still held there", op(payment.ChargeReversed, 0, 0), []processor.Payment{pay("authorized", 1000, 0, 0)}, reconcile.StateMismatch,
			"ours is reversed, the processor holds 1000 and keeps 0: psp_a authorized 1000/0/0"},
		{"not ours", nil, []processor.Payment{pay("captured", 1000, 1000, 0)}, reconcile.MissingOnOurSide,
			"the processor has psp_a captured 1000/1000/0; we have no operation under this reference"},
		{"no reference", nil, []processor.Payment{also(pay("captured", 1000, 1000, 0), func(p *processor.Payment) { p.Reference = "" })},
			reconcile.MissingOnOurSide, "a payment without our reference: psp_a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ours []reconcile.Operation
			if tc.ours != nil {
				ours = append(ours, *tc.ours)
			}
			lines := reconcile.Compare(ours, tc.theirs, reconcile.Window{Since: since, Until: until, Now: now, Settle: 10 * time.Minute})
			if len(lines) != 1 {
				t.Fatalf("%d lines, want 1: %+v", len(lines), lines)
			}
			if l := lines[0]; l.Result != tc.want || l.Detail != tc.detail {
				t.Errorf("%s %q, want %s %q", l.Result, l.Detail, tc.want, tc.detail)
			}
		})
	}
}

// TestCompareWindow: a reference is reported when our operation was created
// in the window, or its payment was; a payment after the window is read
// (a late re-drive) but reported only with an operation of the window.
func TestCompareWindow(t *testing.T) {
	t.Parallel()
	mk := func(ref string, created time.Time) reconcile.Operation {
		o := *op(payment.ChargeSucceeded, 1000, 0)
		o.Reference, o.CreatedAt = ref, created
		return o
	}
	pm := func(ref string, created time.Time) processor.Payment {
		p := pay("captured", 1000, 1000, 0)
		p.Reference, p.PSPReference, p.Created = ref, "psp_"+ref, created
		return p
	}
	ours := []reconcile.Operation{
		mk("ch_in", in),
		mk("ch_late_payment", until.Add(-time.Millisecond)), // its payment after the window
		mk("ch_before", since.Add(-time.Millisecond)),       // its payment in the window
		mk("ch_old", since.Add(-time.Hour)),                 // read by reference, its payment before too
	}
	theirs := []processor.Payment{
		pm("ch_in", in), pm("ch_late_payment", until.Add(time.Millisecond)), pm("ch_before", since),
		pm("ch_next", until.Add(time.Second)), // the next window's
		pm("ch_old", since.Add(-time.Hour)),
	}
	lines := reconcile.Compare(ours, theirs, reconcile.Window{Since: since, Until: until, Now: now})
	var got []string
	for _, l := range lines {
		got = append(got, l.Reference+" "+string(l.Result))
	}
	want := []string{"ch_before matched", "ch_in matched", "ch_late_payment matched"}
	if len(got) != len(want) {
		t.Fatalf("lines %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("lines %v, want %v", got, want)
			break
		}
	}
}
