package procsim

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// cancelAll gives back whatever p holds (a pending decision, an uncaptured
// authorization, a capture not yet refunded) and leaves p in status. It
// returns the amount given back, and false when p held nothing.
func cancelAll(p *Payment, status string) (int64, bool) {
	switch p.Status {
	case StatusPending, StatusAuthorized, StatusCaptured:
	default:
		return 0, false
	}
	amount := p.ApprovedAmount - p.RefundedAmount
	p.RefundedAmount = p.CapturedAmount
	p.Status = status
	return amount, true
}

// reverse is a technical cancel by our reference: every payment carrying it
// is cancelled or refunded, whatever was done to it. A payment made with a
// method whose reversals are refused refuses the whole reversal, which is
// then not kept under its key, so the same key may try again.
func reverse(ref string) op {
	return func(ctx context.Context, tx pgx.Tx, now time.Time) (result, error) {
		ps, err := lockPaymentsByReference(ctx, tx, ref)
		if err != nil {
			return result{}, err
		}
		refused := false
		for i := range ps {
			p := &ps[i]
			m, _ := LookupMethod(p.PaymentMethod)
			if p.Status == StatusReversed || p.refusals >= m.ReversalRefusals {
				continue
			}
			p.refusals++
			refused = true
			if err := savePayment(ctx, tx, *p, now); err != nil {
				return result{}, err
			}
			if err := recordAction(ctx, tx, p.PSPReference, actionReversalRefused, 0, now); err != nil {
				return result{}, err
			}
		}
		if refused {
			a := errorAnswer(http.StatusServiceUnavailable, "reversal_refused", "the reversal was refused; try again later")
			return result{answer: a}, nil
		}
		psps := make([]string, 0, len(ps))
		for i := range ps {
			p := &ps[i]
			psps = append(psps, p.PSPReference)
			amount, changed := cancelAll(p, StatusReversed)
			if !changed {
				continue
			}
			if err := savePayment(ctx, tx, *p, now); err != nil {
				return result{}, err
			}
			if err := recordAction(ctx, tx, p.PSPReference, actionReversal, amount, now); err != nil {
				return result{}, err
			}
		}
		if ps == nil {
			ps = []Payment{}
		}
		a := jsonAnswer(http.StatusOK, ReversalAnswer{Reference: ref, Status: StatusReversed, Payments: ps}, psps...)
		return result{answer: a, keep: true}, nil
	}
}
