package procsim

import (
	"context"
	"fmt"
)

// Audit is every reference the simulator has seen and what was done to it.
type Audit struct {
	References []AuditReference `json:"references"`
}

// AuditReference is what was done under one of our references, in total and
// payment by payment.
type AuditReference struct {
	Reference string `json:"reference"`
	AuditCounts
	Payments []AuditPayment `json:"payments"`
}

// AuditCounts counts the actions done and sums the money they moved.
type AuditCounts struct {
	Approvals        int   `json:"approvals"`
	ApprovedAmount   int64 `json:"approved_amount"`
	Declines         int   `json:"declines"`
	Captures         int   `json:"captures"`
	CapturedAmount   int64 `json:"captured_amount"`
	Voids            int   `json:"voids"`
	Refunds          int   `json:"refunds"`
	RefundedAmount   int64 `json:"refunded_amount"`
	Reversals        int   `json:"reversals"`
	ReversedAmount   int64 `json:"reversed_amount"`
	ReversalRefusals int   `json:"reversal_refusals"`
	Expiries         int   `json:"expiries"`
	ExpiredAmount    int64 `json:"expired_amount"`
}

func (c *AuditCounts) add(o AuditCounts) {
	c.Approvals += o.Approvals
	c.ApprovedAmount += o.ApprovedAmount
	c.Declines += o.Declines
	c.Captures += o.Captures
	c.CapturedAmount += o.CapturedAmount
	c.Voids += o.Voids
	c.Refunds += o.Refunds
	c.RefundedAmount += o.RefundedAmount
	c.Reversals += o.Reversals
	c.ReversedAmount += o.ReversedAmount
	c.ReversalRefusals += o.ReversalRefusals
	c.Expiries += o.Expiries
	c.ExpiredAmount += o.ExpiredAmount
}

// AuditPayment is one payment and the actions done to it.
type AuditPayment struct {
	PSPReference  string `json:"psp_reference"`
	PaymentMethod string `json:"payment_method"`
	Status        string `json:"status"`
	Answered      bool   `json:"answered"`
	AuditCounts
}

const auditQuery = `
SELECT p.reference, p.psp_reference, p.payment_method, p.status, p.answered_at IS NOT NULL,
	count(*) FILTER (WHERE a.kind = 'authorize'), coalesce(sum(a.amount) FILTER (WHERE a.kind = 'authorize'), 0),
	count(*) FILTER (WHERE a.kind = 'decline'),
	count(*) FILTER (WHERE a.kind = 'capture'), coalesce(sum(a.amount) FILTER (WHERE a.kind = 'capture'), 0),
	count(*) FILTER (WHERE a.kind = 'void'),
	count(*) FILTER (WHERE a.kind = 'refund'), coalesce(sum(a.amount) FILTER (WHERE a.kind = 'refund'), 0),
	count(*) FILTER (WHERE a.kind = 'reversal'), coalesce(sum(a.amount) FILTER (WHERE a.kind = 'reversal'), 0),
	count(*) FILTER (WHERE a.kind = 'reversal_refused'),
	count(*) FILTER (WHERE a.kind = 'expire'), coalesce(sum(a.amount) FILTER (WHERE a.kind = 'expire'), 0)
FROM procsim_payments p LEFT JOIN procsim_actions a USING (psp_reference)
WHERE $1 = '' OR p.reference = $1
GROUP BY p.psp_reference
ORDER BY p.reference, p.created_at, p.psp_reference`

// Audit returns what was done under every reference, or under ref alone
// when it is not "".
func (s *Store) Audit(ctx context.Context, ref string) (Audit, error) {
	rows, err := s.pool.Query(ctx, auditQuery, ref)
	if err != nil {
		return Audit{}, fmt.Errorf("audit: %w", err)
	}
	defer rows.Close()
	a := Audit{References: []AuditReference{}}
	for rows.Next() {
		var (
			r string
			p AuditPayment
			c = &p.AuditCounts
		)
		if err := rows.Scan(&r, &p.PSPReference, &p.PaymentMethod, &p.Status, &p.Answered,
			&c.Approvals, &c.ApprovedAmount, &c.Declines, &c.Captures, &c.CapturedAmount, &c.Voids,
			&c.Refunds, &c.RefundedAmount, &c.Reversals, &c.ReversedAmount, &c.ReversalRefusals,
			&c.Expiries, &c.ExpiredAmount); err != nil {
			return Audit{}, fmt.Errorf("audit: %w", err)
		}
		if n := len(a.References); n == 0 || a.References[n-1].Reference != r {
			a.References = append(a.References, AuditReference{Reference: r})
		}
		last := &a.References[len(a.References)-1]
		last.add(p.AuditCounts)
		last.Payments = append(last.Payments, p)
	}
	if err := rows.Err(); err != nil {
		return Audit{}, fmt.Errorf("audit: %w", err)
	}
	return a, nil
}
