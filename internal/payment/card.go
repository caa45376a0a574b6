package payment

import (
	"errors"
	"fmt"
	"regexp"
)

// Charges at a card processor. A charge names either an account here
// (AccountID) or a payment method at an external processor (PaymentMethod),
// never both. A card charge moves money outside this database: it moves no
// account's balance and holds nothing here, and while the processor's answer
// is not known it is ChargeProcessing. docs/processors.md has its states.

// The states only a card charge takes, besides succeeded, authorized and
// failed.
const (
	// ChargeProcessing: the processor's outcome is not known yet.
	ChargeProcessing ChargeStatus = "processing"
	// ChargeReversing: the outcome stayed unknown (or an approval came after
	// the charge had failed), and a reversal by our reference is under way.
	ChargeReversing ChargeStatus = "reversing"
	// ChargeReversed: whatever the processor did under the charge was
	// cancelled or refunded; no money moved.
	ChargeReversed ChargeStatus = "reversed"
	// ChargeRequiresReview: the processor refused the reversal too often; an
	// operator settles the charge.
	ChargeRequiresReview ChargeStatus = "requires_review"
)

// The failure codes of card charges.
const (
	// FailureCardDeclined: the processor declined the card; DeclineCode
	// keeps its reason.
	FailureCardDeclined = "card-declined"
	// FailureProcessorNoRecord: past the processor's decision deadline it
	// had no record of the charge: it never happened.
	FailureProcessorNoRecord = "processor-no-record"
	// FailureProcessorCancelled: the processor cancelled the authorization
	// itself (its decision deadline passed with the answer undelivered);
	// DeclineCode keeps the processor's status.
	FailureProcessorCancelled = "processor-cancelled"
	// FailureOperatorResolved: the charge was in review (its reversal was
	// refused too often) and an operator, having read the processor's
	// records, settled it as failed: no money moved.
	FailureOperatorResolved = "operator-resolved"
)

// The events only card charges write.
const (
	EventChargeProcessing     = "charge.processing"
	EventChargeReversing      = "charge.reversing"
	EventChargeReversed       = "charge.reversed"
	EventChargeRequiresReview = "charge.requires_review"
)

// NewCardCharge is the request to charge a payment method at the processor.
type NewCardCharge struct {
	PaymentMethod string
	Amount        int64
	Currency      string
	Description   *string
	Metadata      map[string]string
	// Authorize (capture=false) authorizes only: the processor holds the
	// amount until a capture or a void.
	Authorize bool
}

// paymentMethodPattern is the shape of a payment method id.
var paymentMethodPattern = regexp.MustCompile(`^pm_[A-Za-z0-9_]{1,64}$`)

// ValidatePaymentMethod checks that pm looks like a payment method id: pm_
// followed by 1 to 64 letters, digits or underscores.
func ValidatePaymentMethod(field, pm string) error {
	if !paymentMethodPattern.MatchString(pm) {
		return Invalid(field, "must be a payment method id: pm_ followed by 1 to 64 letters, digits or underscores, got %q", pm)
	}
	return nil
}

// Validate returns a *ValidationError naming the first field that breaks the rules.
func (n NewCardCharge) Validate() error {
	if err := ValidatePaymentMethod("payment_method", n.PaymentMethod); err != nil {
		return err
	}
	if err := ValidateAmount("amount", n.Amount); err != nil {
		return err
	}
	if err := ValidateCurrency("currency", n.Currency); err != nil {
		return err
	}
	return validateFreeForm(n.Description, n.Metadata)
}

// IsCard reports whether c is a charge at a card processor.
func (c Charge) IsCard() bool { return c.PaymentMethod != "" }

// Final reports whether c's status is one no processor outcome changes by
// itself: everything but processing and reversing.
func (c Charge) Final() bool { return c.Status != ChargeProcessing && c.Status != ChargeReversing }

// cardChargeStateMessage is ChargeStateError's message for a card charge.
func cardChargeStateMessage(c Charge, verb string) string {
	id := FormatID(PrefixCharge, c.ID)
	switch {
	case c.Status == ChargeProcessing:
		return fmt.Sprintf("charge %s is processing at the card processor: it cannot be %s before its outcome is known", id, verb)
	case verb == "refunded":
		return fmt.Sprintf("charge %s is %s; only a succeeded (captured) charge can be refunded", id, c.Status)
	}
	return fmt.Sprintf("charge %s is %s; only an authorized charge can be %s", id, c.Status, verb)
}

// Captures, voids and refunds of card charges go to the processor, each as
// an operation of its own (internal/cards). While one is in flight the
// charge keeps its status (a refund is RefundPending, its amount reserved);
// its outcome changes the charge, or, refused by the processor, changes
// nothing but the refund, which is RefundFailed.

// RefundStatus is a card charge's refund's state at the processor.
type RefundStatus string

// The states of a card charge's refund.
const (
	RefundPending   RefundStatus = "pending"
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
)

// The kinds of operations on a card charge after its authorization.
const (
	OperationCapture = "capture"
	OperationVoid    = "void"
	OperationRefund  = "refund"
)

// ErrOperationInProgress refuses a capture or a void of a card charge while
// another capture or void of it is in flight at the processor (or in
// review): its outcome decides what the charge is.
var ErrOperationInProgress = errors.New("a capture or void of the charge is in flight at the processor")

// OperationInProgress is ErrOperationInProgress naming the charge and the
// operation in flight.
type OperationInProgress struct {
	Charge Charge
	Kind   string // the operation in flight
}

func (e *OperationInProgress) Error() string {
	return fmt.Sprintf("a %s of charge %s is in flight at the card processor; its outcome decides what the charge is "+
		"(it reads %s until then)", e.Kind, FormatID(PrefixCharge, e.Charge.ID), e.Charge.Status)
}

// Unwrap makes an OperationInProgress ErrOperationInProgress.
func (e *OperationInProgress) Unwrap() error { return ErrOperationInProgress }

// ErrProcessorDeclined is a capture, void or refund of a card charge that
// the processor refused (OperationDeclined says which and why): nothing
// moved, the charge is as it was.
var ErrProcessorDeclined = errors.New("the card processor refused the operation")

// OperationDeclined is ErrProcessorDeclined: the kind of operation, the
// charge (as it stays) and the processor's code (invalid_state, ...).
type OperationDeclined struct {
	Kind   string
	Charge Charge
	Code   string
}

func (e *OperationDeclined) Error() string {
	return fmt.Sprintf("the card processor refused the %s of charge %s (%s): nothing moved, the charge is %s",
		e.Kind, FormatID(PrefixCharge, e.Charge.ID), e.Code, e.Charge.Status)
}

// Unwrap makes an OperationDeclined ErrProcessorDeclined.
func (e *OperationDeclined) Unwrap() error { return ErrProcessorDeclined }

// CardOperation is how a capture, void or refund of a card charge ended,
// for the response stored under its key: done (Err nil: the charge, and for
// a refund the refund), or refused (Err: a refusal before the processor was
// called, or the processor's OperationDeclined).
type CardOperation struct {
	Kind   string
	Charge Charge
	Refund *Refund
	Err    error
}

// ErrNoProcessor is a card charge, or a webhook, asked of a service that
// charges no cards (PROCESSOR is none). Nothing was written.
var ErrNoProcessor = errors.New("this deployment charges no cards: no card processor is configured (PROCESSOR is none; set PROCESSOR=simulator or stripe)")

// ErrProcessorNotConfigured is a capture, void or refund of a card charge
// authorized at a processor this service is not configured for: its
// operations go to that one alone. Nothing was written.
var ErrProcessorNotConfigured = errors.New("the card charge's processor is not configured here")

// The refusals a card charge is answered with once final without an
// approval (CardChargeFailure says which).
var (
	// ErrCardDeclined: the processor declined the card.
	ErrCardDeclined = errors.New("the card was declined")
	// ErrCardChargeFailed: the processor had no record of the charge past
	// its decision deadline, or cancelled it itself, or an operator settled
	// it as failed after a review.
	ErrCardChargeFailed = errors.New("the card charge failed at the processor")
	// ErrChargeReversed: the outcome stayed unknown, and the charge was
	// reversed at the processor.
	ErrChargeReversed = errors.New("the card charge was reversed")
)

// CardChargeFailure is the refusal of a card charge that failed or was
// reversed at the processor: the charge exists, final. It is the error
// (ErrCardDeclined, ErrCardChargeFailed or ErrChargeReversed) its status
// and failure code say.
type CardChargeFailure struct{ Charge Charge }

func (e *CardChargeFailure) Error() string {
	id := FormatID(PrefixCharge, e.Charge.ID)
	switch {
	case e.Charge.Status == ChargeReversed:
		return fmt.Sprintf("the processor's outcome of charge %s stayed unknown, so it was reversed: no money moved", id)
	case e.Charge.FailureCode == FailureCardDeclined:
		return fmt.Sprintf("the processor declined charge %s of %d %s: %s", id, e.Charge.Amount, e.Charge.Currency, e.Charge.DeclineCode)
	case e.Charge.FailureCode == FailureProcessorCancelled:
		return fmt.Sprintf("the processor cancelled charge %s (%s): no money moved", id, e.Charge.DeclineCode)
	case e.Charge.FailureCode == FailureOperatorResolved:
		return fmt.Sprintf("charge %s was settled as failed by an operator after a review of the processor's records: no money moved", id)
	}
	return fmt.Sprintf("the processor has no record of charge %s past its decision deadline: no money moved", id)
}

// Unwrap makes a CardChargeFailure the error its charge's state says.
func (e *CardChargeFailure) Unwrap() error {
	switch {
	case e.Charge.Status == ChargeReversed:
		return ErrChargeReversed
	case e.Charge.FailureCode == FailureCardDeclined:
		return ErrCardDeclined
	}
	return ErrCardChargeFailed
}
