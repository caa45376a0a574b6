// Package reconcile compares our card charges with a card processor's own
// records, reference by reference, and says where they disagree (payments
// reconcile). It knows no processor and no database: Compare takes our
// authorizations (Operation, read by the Store port) and the processor's
// payments (processor.Records), and Reconcile runs one reconciliation over
// both ports. docs/processors.md, "Reconciliation", says what agreeing means.
package reconcile

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
)

// Operation is our side of one authorization at the processor: the
// operation and its charge as they stand.
type Operation struct {
	// Reference is ours, as the processor carries it (ch_...).
	Reference string
	// State is the operation's (processing, succeeded, failed, reversing,
	// reversed, requires_review).
	State string
	// Status, Amount, AmountCaptured, AmountRefunded and Currency are the
	// charge's.
	Status                                 payment.ChargeStatus
	Amount, AmountCaptured, AmountRefunded int64
	Currency                               string
	// OpenFollowUps counts the charge's captures, voids and refunds still
	// processing or in review: what the processor shows may be ahead of
	// the charge until they end.
	OpenFollowUps int
	CreatedAt     time.Time
	// ChangedAt is the last change of the operation or of its charge's
	// captures, voids and refunds.
	ChangedAt time.Time
}

// Result is what reconciliation found for one reference.
type Result string

// The results. Matched and Pending agree (or cannot disagree yet); every
// other result is a mismatch.
const (
	Matched            Result = "matched"
	Pending            Result = "pending"
	MissingOnOurSide   Result = "missing_on_our_side"
	MissingAtProcessor Result = "missing_at_processor"
	AmountMismatch     Result = "amount_mismatch"
	StateMismatch      Result = "state_mismatch"
)

// Results are every result, in the order reports count them.
var Results = []Result{Matched, Pending, MissingOnOurSide, MissingAtProcessor, AmountMismatch, StateMismatch}

// Mismatch reports whether r is a disagreement.
func (r Result) Mismatch() bool { return r != Matched && r != Pending }

// Line is one reference's result, with both sides as they were read.
type Line struct {
	Reference string
	Result    Result
	// Detail says what disagrees, or why it is pending.
	Detail string
	// Ours is nil when we have no operation under Reference.
	Ours *Operation
	// Payments are the processor's under Reference (none: it has none).
	Payments []processor.Payment
}

// Window is what one reconciliation covers: the operations we created and
// the payments the processor created in [Since, Until); an operation
// created or changed (its own state, a capture, void or refund of its
// charge) after Now-Settle is not final enough to disagree.
type Window struct {
	Since, Until time.Time
	Now          time.Time
	Settle       time.Duration
}

// Compare reconciles ours with payments, reference by reference, and
// returns a line per reference, sorted by reference. Our operations are
// those created in the window and those of references the processor
// shows; the payments are those the processor created in the window and
// after it (an operation's payment may be created up to its decision
// deadline later). A reference is reported when our operation was created
// in the window or, without one in it, when one of its payments was: a
// payment after the window whose operation is not in it is the next
// window's. A payment without our reference is a line of its own.
func Compare(ours []Operation, payments []processor.Payment, w Window) []Line {
	byRef := map[string][]processor.Payment{}
	var lines []Line
	for _, p := range payments {
		if p.Reference == "" {
			if in(p.Created, w) {
				lines = append(lines, Line{Reference: "", Result: MissingOnOurSide,
					Detail: "a payment without our reference: " + p.PSPReference, Payments: []processor.Payment{p}})
			}
			continue
		}
		byRef[p.Reference] = append(byRef[p.Reference], p)
	}
	seen := map[string]bool{}
	for i := range ours {
		op := &ours[i]
		seen[op.Reference] = true
		ps := byRef[op.Reference]
		if !in(op.CreatedAt, w) && !slices.ContainsFunc(ps, func(p processor.Payment) bool { return in(p.Created, w) }) {
			continue
		}
		result, detail := judge(op, ps, w)
		lines = append(lines, Line{Reference: op.Reference, Result: result, Detail: detail, Ours: op, Payments: ps})
	}
	for ref, ps := range byRef {
		if seen[ref] || !slices.ContainsFunc(ps, func(p processor.Payment) bool { return in(p.Created, w) }) {
			continue
		}
		lines = append(lines, Line{Reference: ref, Result: MissingOnOurSide,
			Detail: "the processor has " + describe(ps) + "; we have no operation under this reference", Payments: ps})
	}
	slices.SortFunc(lines, func(a, b Line) int {
		return cmp.Or(strings.Compare(a.Reference, b.Reference), strings.Compare(psp(a), psp(b)))
	})
	return lines
}

func in(t time.Time, w Window) bool { return !t.Before(w.Since) && t.Before(w.Until) }

func psp(l Line) string {
	if len(l.Payments) == 0 {
		return ""
	}
	return l.Payments[0].PSPReference
}

// judge decides one reference: pending while either side is still
// deciding, else whether the processor's money agrees with the charge's.
func judge(op *Operation, ps []processor.Payment, w Window) (Result, string) {
	if why := pending(op, ps, w); why != "" {
		return Pending, why
	}
	m := moneyOf(ps)
	switch op.Status {
	case payment.ChargeSucceeded:
		return expectLive(op, ps, m, "captured", op.AmountCaptured)
	case payment.ChargeAuthorized:
		return expectLive(op, ps, m, "authorized", 0)
	case payment.ChargeVoided, payment.ChargeExpired, payment.ChargeFailed, payment.ChargeReversed:
		if m.held != 0 || m.kept != 0 {
			return StateMismatch, fmt.Sprintf("ours is %s, the processor holds %d and keeps %d: %s", op.Status, m.held, m.kept, describe(ps))
		}
		if len(ps) == 0 && op.Status == payment.ChargeVoided {
			return MissingAtProcessor, "ours is voided, the processor has no payment under this reference"
		}
		return Matched, ""
	}
	return StateMismatch, fmt.Sprintf("ours is %s, which reconciliation does not know", op.Status)
}

// pending says why a reference cannot be judged yet, or "".
func pending(op *Operation, ps []processor.Payment, w Window) string {
	switch {
	case op.State == "processing" || op.State == "reversing":
		return "our operation is " + op.State
	case op.State == "requires_review" || op.Status == payment.ChargeRequiresReview:
		return "in review (payments charges resolve)"
	case op.OpenFollowUps > 0:
		return fmt.Sprintf("%d capture, void or refund of the charge still open", op.OpenFollowUps)
	case op.CreatedAt.After(w.Now.Add(-w.Settle)) || op.ChangedAt.After(w.Now.Add(-w.Settle)):
		return "changed within the settle margin"
	case slices.ContainsFunc(ps, func(p processor.Payment) bool { return p.Status == "pending" }):
		return "the processor has not decided yet"
	}
	return ""
}

// money is what the processor's payments under one reference hold: held
// is approved and not captured (live authorizations), kept is captured and
// not refunded; live counts the payments that hold or keep money, or took
// it (refunded since).
type money struct {
	held, kept int64
	live       int
}

func moneyOf(ps []processor.Payment) money {
	var m money
	for _, p := range ps {
		held := int64(0)
		if p.Status == "authorized" {
			held = p.ApprovedAmount - p.CapturedAmount
		}
		kept := p.CapturedAmount - p.RefundedAmount
		m.held += held
		m.kept += kept
		if held > 0 || kept > 0 || isCaptured(p) {
			m.live++
		}
	}
	return m
}

// isCaptured reports a payment whose money was taken, whatever was refunded
// of it since (by a refund, not a reversal).
func isCaptured(p processor.Payment) bool {
	return p.Status == "captured" || p.Status == "refunded" || p.Status == "partially_refunded"
}

// expectLive judges a charge that holds money at the processor: exactly one
// live payment, in status want (captured: also refunded), whose amounts are
// the charge's.
func expectLive(op *Operation, ps []processor.Payment, m money, want string, captured int64) (Result, string) {
	if len(ps) == 0 {
		return MissingAtProcessor, fmt.Sprintf("ours is %s, the processor has no payment under this reference", op.Status)
	}
	var live []processor.Payment
	for _, p := range ps {
		if p.Status == want || (want == "captured" && isCaptured(p)) {
			live = append(live, p)
		}
	}
	if len(live) != 1 || m.live != 1 {
		return StateMismatch, fmt.Sprintf("ours is %s, the processor has %s", op.Status, describe(ps))
	}
	p := live[0]
	var diffs []string
	for _, d := range []struct {
		what        string
		ours, their int64
	}{
		{"amount", op.Amount, p.Amount},
		{"approved", op.Amount, p.ApprovedAmount},
		{"captured", captured, p.CapturedAmount},
		{"refunded", op.AmountRefunded, p.RefundedAmount},
	} {
		if d.ours != d.their {
			diffs = append(diffs, fmt.Sprintf("%s %d here, %d at the processor", d.what, d.ours, d.their))
		}
	}
	if !strings.EqualFold(op.Currency, p.Currency) {
		diffs = append(diffs, fmt.Sprintf("currency %s here, %s at the processor", op.Currency, p.Currency))
	}
	if len(diffs) > 0 {
		return AmountMismatch, strings.Join(diffs, "; ")
	}
	return Matched, ""
}

// describe lists payments as "psp_1 captured 1000/1000/0" (approved,
// captured, refunded), or "no payment".
func describe(ps []processor.Payment) string {
	if len(ps) == 0 {
		return "no payment"
	}
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %s %d/%d/%d", p.PSPReference, p.Status, p.ApprovedAmount, p.CapturedAmount, p.RefundedAmount))
	}
	return strings.Join(parts, ", ")
}
