package cards

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/payment"
)

// Reviews. A charge goes to requires_review when the processor keeps
// refusing its reversal: the processor may hold the customer's money, and
// only its records say whether it does. An operator reads them (the
// simulator's audit) and settles the charge with Resolve (payments charges
// resolve): succeeded when the processor kept the money, failed when it did
// not. A settlement is a transition like every other (decide, then a
// compare-and-set from requires_review) with its event and the key's final
// response, and its audit row in the same transaction. It calls no
// processor.

// The bounds of a settlement's reason and operator, in characters.
const (
	MaxReasonLength   = 500
	MaxOperatorLength = 100
)

// ErrNotInReview is a settlement of a charge that is not in
// requires_review (anymore: another settlement may have won); the error
// that wraps it names the charge's status.
var ErrNotInReview = errors.New("the charge is not in review")

// Settlement is an operator's decision on a card charge in review.
type Settlement struct {
	Charge uuid.UUID
	// As is what the processor's records say it did: payment.ChargeSucceeded
	// (it kept the money: the charge succeeds, or is authorized when it was
	// created with capture false) or payment.ChargeFailed (it did not: the
	// charge fails with payment.FailureOperatorResolved).
	As payment.ChargeStatus
	// Reason (the evidence) and Operator (who decided) are kept in the
	// audit; both are required, trimmed, at most MaxReasonLength and
	// MaxOperatorLength characters.
	Reason, Operator string
}

// Resolve settles the card charge in review that s names, and returns it
// as it now is: its event written, the response of the key bound to it
// stored (201 or 402, rendered by Options.Render), its operation closed,
// and the audit row written, all in one transaction. Errors: a
// *payment.ValidationError for a bad settlement (nothing read),
// payment.ErrNotFound when no card charge has that id, ErrNotInReview
// (wrapped, naming the charge's status) when it is not in review or another
// settlement won, payment.ErrUnavailable.
func (c *Cards) Resolve(ctx context.Context, s Settlement) (payment.Charge, error) {
	s, err := s.checked()
	if err != nil {
		return payment.Charge{}, err
	}
	op, err := c.store.OperationByReference(ctx, s.Charge)
	if err != nil {
		return payment.Charge{}, err
	}
	fetched := time.Now()
	kind := resolvedFailed
	if s.As == payment.ChargeSucceeded {
		kind = resolvedSucceeded
	}
	t, ok := c.decide(op, outcome{kind: kind})
	if !ok {
		return payment.Charge{}, notInReview(op)
	}
	if err := c.complete(&t); err != nil {
		return payment.Charge{}, err
	}
	t.Resolution = &carddb.Resolution{ID: payment.NewID(), As: string(s.As), Reason: s.Reason, Operator: s.Operator}
	w, err := c.store.Transition(ctx, t)
	if err != nil {
		return payment.Charge{}, err
	}
	if !w.Applied {
		// Nothing but a settlement leaves review: another one won.
		if op, err = c.store.Operation(ctx, op.Merchant, op.ID); err != nil {
			return payment.Charge{}, err
		}
		return payment.Charge{}, notInReview(op)
	}
	c.observe(op, fetched, t)
	c.opts.Log.Info("card charge settled by an operator", "charge_id", reference(op), "as", string(s.As), "operator", s.Operator)
	return t.Charge, nil
}

func notInReview(op carddb.Operation) error {
	return fmt.Errorf("%w: charge %s is %s; only a charge in %s is settled", ErrNotInReview, reference(op),
		op.Charge.Status, payment.ChargeRequiresReview)
}

// checked returns s trimmed, or a *payment.ValidationError naming its first
// field at fault.
func (s Settlement) checked() (Settlement, error) {
	if s.As != payment.ChargeSucceeded && s.As != payment.ChargeFailed {
		return s, payment.Invalid("as", "must be succeeded (the processor kept the money) or failed (it did not), got %q", s.As)
	}
	s.Reason, s.Operator = strings.TrimSpace(s.Reason), strings.TrimSpace(s.Operator)
	if err := checkText("reason", s.Reason, MaxReasonLength); err != nil {
		return s, err
	}
	if err := checkText("operator", s.Operator, MaxOperatorLength); err != nil {
		return s, err
	}
	if strings.ContainsFunc(s.Operator, unicode.IsControl) {
		return s, payment.Invalid("operator", "must be one line of printable text")
	}
	return s, nil
}

// checkText checks that v is text of 1 to limit characters.
func checkText(field, v string, limit int) error {
	switch n := utf8.RuneCountInString(v); {
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		return payment.Invalid(field, "must be UTF-8 text without NUL")
	case n == 0:
		return payment.Invalid(field, "is required")
	case n > limit:
		return payment.Invalid(field, "must be at most %d characters, got %d", limit, n)
	}
	return nil
}
