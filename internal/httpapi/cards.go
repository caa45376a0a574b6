package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/processor"
)

// Charges at a card processor (internal/cards): POST /v1/charges with a
// payment_method, and the processor's webhooks.

// CardBackend is what the API needs for card charges; cmd/payments passes
// the use case (cards.Cards).
type CardBackend interface {
	// Charge charges a card at most once per (merchant, key): the key's
	// final response, or, when the outcome is not known within the wait,
	// the charge as it stands (processing set, res.Operation its
	// operation). See cards.Cards.Charge.
	Charge(ctx context.Context, req idempotency.Request, in payment.NewCardCharge) (res idempotency.Result, processing *payment.Charge, err error)
	// Capture, Void and Refund go to the processor under the request's key
	// as Charge does: the key's final response, or, when the outcome is not
	// known within the wait, the charge (the refund) as it stands. See
	// cards.Cards.Capture.
	Capture(ctx context.Context, req idempotency.Request, chargeID uuid.UUID, amount *int64) (idempotency.Result, *payment.Charge, error)
	Void(ctx context.Context, req idempotency.Request, chargeID uuid.UUID) (idempotency.Result, *payment.Charge, error)
	Refund(ctx context.Context, req idempotency.Request, chargeID uuid.UUID, amount *int64) (idempotency.Result, *payment.Refund, error)
	// HandleEvent verifies and applies a processor's webhook; see
	// cards.Cards.HandleEvent.
	HandleEvent(ctx context.Context, signature string, body []byte) error
}

// retryAfterProcessing is the Retry-After of a 202: a charge still
// processing is worth asking about again after it.
const retryAfterProcessing = 1

// createCardCharge runs a card charge, whose request was checked before its
// key is claimed: 201 or 402 (stored under the key, replayed byte for byte),
// or 202 with the charge still processing (nothing stored: the key stays
// bound to the charge until its outcome is written).
func (s *Server) createCardCharge(w http.ResponseWriter, r *http.Request, req idempotency.Request, in payment.NewCardCharge) {
	if s.opts.Cards == nil {
		s.fail(w, r, payment.ErrNoProcessor)
		return
	}
	_ = s.executeWith(w, r, req, func(ctx context.Context) (idempotency.Result, error) {
		res, processing, err := s.opts.Cards.Charge(ctx, req, in)
		if err != nil || processing == nil {
			return res, err
		}
		// Rendered here, not stored: a retry answers the charge as it
		// then stands.
		resp, err := jsonResponse(http.StatusAccepted, chargeLocation(processing.ID), processing)
		res.Response = resp
		return res, err
	})
}

// RenderCardCharge renders a card charge's final state as the response
// stored under its key: 201 with the charge when the processor approved it
// (succeeded, or authorized with capture false), else the 402 problem of
// its failure (card-declined, card-charge-failed) or its reversal
// (charge-reversed), naming the charge.
func RenderCardCharge(c payment.Charge) (idempotency.Response, error) {
	switch c.Status {
	case payment.ChargeSucceeded, payment.ChargeAuthorized:
		return created(chargeLocation(c.ID), c)
	case payment.ChargeFailed, payment.ChargeReversed:
		err := &payment.CardChargeFailure{Charge: c}
		p, _ := problemFor(err)
		return problemFromError(p, err).response(), nil
	}
	return idempotency.Response{}, errors.New("a card charge " + string(c.Status) + " has no final response")
}

func chargeLocation(id [16]byte) string {
	return "/v1/charges/" + payment.FormatID(payment.PrefixCharge, id)
}

func refundLocation(rf payment.Refund) string {
	return chargeLocation(rf.ChargeID) + "/refunds/" + payment.FormatID(payment.PrefixRefund, rf.ID)
}

// RenderCardOperation renders how a capture, void or refund of a card
// charge ended as the response stored under its key: 200 with the charge
// (captured, voided), 201 with the refund, or the problem of its refusal
// (charge-not-capturable, capture-exceeds-authorization,
// charge-operation-in-progress, processor-declined, ...). An error that is
// no refusal is returned: nothing is stored.
func RenderCardOperation(o payment.CardOperation) (idempotency.Response, error) {
	switch {
	case o.Err != nil:
		return refusal(nameMissing(o.Err, "charge", payment.FormatID(payment.PrefixCharge, o.Charge.ID)))
	case o.Refund != nil:
		return created(refundLocation(*o.Refund), *o.Refund)
	}
	return jsonResponse(http.StatusOK, "", o.Charge)
}

// isCardCharge reports whether the merchant's charge id is a card charge
// this service can send captures, voids and refunds of to the processor.
// A charge's payer never changes, so this read may come before the key:
// an unknown charge, or a failed read, takes the account's path, which
// answers it.
func (s *Server) isCardCharge(ctx context.Context, merchant, id uuid.UUID) bool {
	if s.opts.Cards == nil {
		return false
	}
	c, err := s.backend.Charge(ctx, merchant, id)
	return err == nil && c.IsCard()
}

// cardOperation runs a capture, void or refund of a card charge: its
// stored response (200, 201 or a refusal), or 202 with the object as it
// stands (nothing stored: the key stays bound to the operation until its
// outcome is written).
func (s *Server) cardOperation(w http.ResponseWriter, r *http.Request, req idempotency.Request,
	run func(ctx context.Context) (idempotency.Result, string, any, error)) {
	_ = s.executeWith(w, r, req, func(ctx context.Context) (idempotency.Result, error) {
		res, location, processing, err := run(ctx)
		if err != nil || processing == nil {
			return res, err
		}
		resp, err := jsonResponse(http.StatusAccepted, location, processing)
		res.Response = resp
		return res, err
	})
}

// processorEvent receives the simulator's webhooks (POST
// /v1/processor/events), signed with PROCESSOR_WEBHOOK_SECRET;
// stripeEvent Stripe's (POST /v1/processor/stripe/events), signed with
// STRIPE_WEBHOOK_SECRET. No API key, but the processor's signature: 200
// once applied (or known already), 400 for a webhook that does not verify,
// 503 for one to deliver again.
func (s *Server) processorEvent(w http.ResponseWriter, r *http.Request) {
	s.receiveEvent(w, r, processor.SimulatorSignatureHeader, "PROCESSOR_WEBHOOK_SECRET")
}

func (s *Server) stripeEvent(w http.ResponseWriter, r *http.Request) {
	s.receiveEvent(w, r, "Stripe-Signature", "STRIPE_WEBHOOK_SECRET")
}

// receiveEvent hands a webhook, signed in header with the secret setting
// names, to the card charges.
func (s *Server) receiveEvent(w http.ResponseWriter, r *http.Request, header, setting string) {
	if s.opts.Cards == nil {
		s.fail(w, r, payment.ErrNoProcessor)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		s.fail(w, r, &bodyError{detail: "could not read the request body"})
		return
	}
	err = s.opts.Cards.HandleEvent(r.Context(), r.Header.Get(header), body)
	if errors.Is(err, processor.ErrBadEvent) {
		s.fail(w, r, &bodyError{detail: "not a verified processor event: check its " + header + " header and " + setting})
		return
	}
	s.answer(w, r, err, map[string]bool{"received": true})
}

// asAny adapts a capture's or a void's answer to cardOperation's: the
// charge as it stands, at its Location, when the outcome is not known yet.
func asAny(res idempotency.Result, processing *payment.Charge, err error) (idempotency.Result, string, any, error) {
	if processing == nil {
		return res, "", nil, err
	}
	return res, chargeLocation(processing.ID), processing, err
}
