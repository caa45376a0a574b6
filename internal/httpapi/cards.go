package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"

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
		s.fail(w, r, payment.ErrProcessorNotConfigured)
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

// processorEvent receives the processor's webhooks (POST
// /v1/processor/events): no API key, but a signature the processor makes
// with PROCESSOR_WEBHOOK_SECRET. 200 once applied (or known already), 400
// for a webhook that does not verify, 503 for one to deliver again.
func (s *Server) processorEvent(w http.ResponseWriter, r *http.Request) {
	if s.opts.Cards == nil {
		s.fail(w, r, payment.ErrProcessorNotConfigured)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		s.fail(w, r, &bodyError{detail: "could not read the request body"})
		return
	}
	err = s.opts.Cards.HandleEvent(r.Context(), r.Header.Get(processor.SimulatorSignatureHeader), body)
	if errors.Is(err, processor.ErrBadEvent) {
		s.fail(w, r, &bodyError{detail: "not a verified processor event: check its signature and PROCESSOR_WEBHOOK_SECRET"})
		return
	}
	s.answer(w, r, err, map[string]bool{"received": true})
}
