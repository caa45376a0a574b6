package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/payment"
)

// ledgerStep is the work of a request under its key, on the ledger, in the
// transaction that claims the key: its response, or an error (a known
// refusal, which execute stores as its problem).
type ledgerStep func(ctx context.Context, l payment.Ledger) (response, error)

// execute runs step once for the request's key, in the transaction that
// claims it, and answers with its response or the replay of an earlier one.
//
// Every answer produced after the key is claimed is stored, business refusals
// included: step's known domain errors (404, 422, …) become stored problems.
// An unexpected error or an outage rolls everything back, key included, so
// the retry executes cleanly.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, req idempotency.Request, step ledgerStep) {
	refusing := idempotency.Respond(func(ctx context.Context, l payment.Ledger) (response, error) {
		resp, err := step(ctx, l)
		if err != nil {
			return refusal(err)
		}
		return resp, nil
	})
	_ = s.executeWith(w, r, req, func(ctx context.Context) (idempotency.Result, error) {
		return s.backend.Idempotent(ctx, req, refusing)
	})
}

// refusal turns a business step's error into the response stored under its
// key: a known refusal (404, 422, ...) is stored as its problem; anything else
// stays an error, so everything rolls back, key included.
func refusal(err error) (response, error) {
	if p, ok := problemFor(err); ok && p.status < 500 {
		return problemFromError(p, err).response(), nil
	}
	return response{}, err
}

// executeWith answers the request from store, which executes it at most once
// per key, behind the front's cache and coalescing. It returns the result it
// answered with (zero after an error), so the caller can count what happened.
func (s *Server) executeWith(w http.ResponseWriter, r *http.Request, req idempotency.Request,
	store func(context.Context) (idempotency.Result, error)) idempotency.Result {
	res, err := s.opts.Front.Do(r.Context(), req, store)
	if err == nil && res.Operation != uuid.Nil {
		// An operation still going on (a card charge's 202): when to ask
		// again. Inline, so that an account's charge runs nothing more.
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterProcessing))
	}
	switch p, _ := problemFor(err); {
	case err != nil && p == probKeyReused:
		s.audit(r, req, metrics.OutcomeMismatch)
		s.fail(w, r, err)
	case err != nil && p == probKeyInUse:
		s.audit(r, req, metrics.OutcomeInUse)
		s.fail(w, r, err)
	case err != nil:
		s.fail(w, r, err)
	case res.Replayed:
		s.audit(r, req, metrics.OutcomeReplayed)
		writeResponse(w, res.Response, true)
	default:
		s.opts.Metrics.Idempotency(metrics.OutcomeClaimed)
		writeResponse(w, res.Response, false)
	}
	if err != nil {
		return idempotency.Result{}
	}
	return res
}

// audit records what happened to a known key, in the log (its merchant and a
// hash of the key, never the key itself) and in the metrics.
func (s *Server) audit(r *http.Request, req idempotency.Request, outcome string) {
	s.opts.Metrics.Idempotency(outcome)
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "idempotency",
		slog.String("request_id", requestIDFrom(r.Context())),
		slog.String("merchant_id", req.MerchantID.String()),
		slog.String("key_hash", idempotency.KeyHash(req.MerchantID, req.Key)),
		slog.String("outcome", outcome),
	)
}
