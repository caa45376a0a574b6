package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/webhook"
)

// maxWebhookURL is the longest URL an endpoint may have, the table's bound
// (migration 0012), in bytes.
const maxWebhookURL = 2048

type webhookEndpointRequest struct {
	URL    string   `json:"url"`
	Events []string `json:"events"`
}

// createWebhookEndpoint records an endpoint (POST /v1/webhook_endpoints):
// 201 with its secret, the only answer that shows it, stored and replayed
// under the key like every POST's. The URL and the events are checked before
// the key is claimed, so a refused URL stores nothing.
func (s *Server) createWebhookEndpoint(w http.ResponseWriter, r *http.Request) {
	var in webhookEndpointRequest
	req, ok := s.readPost(w, r, &in)
	if !ok {
		return
	}
	if err := s.checkWebhookEndpoint(r.Context(), in); err != nil {
		s.fail(w, r, err)
		return
	}
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		secret, err := webhook.NewSecret()
		if err != nil {
			return response{}, err
		}
		e, err := l.CreateWebhookEndpoint(ctx, req.MerchantID, in.URL, in.Events, secret)
		if err != nil {
			return response{}, err
		}
		return created("/v1/webhook_endpoints/"+payment.FormatID(payment.PrefixWebhookEndpoint, e.ID), e)
	})
}

// checkWebhookEndpoint validates a new endpoint: its events, and its URL
// (checkWebhookURL). A refusal is a *payment.ValidationError naming the
// field and the reason.
func (s *Server) checkWebhookEndpoint(ctx context.Context, in webhookEndpointRequest) error {
	if err := payment.ValidateWebhookEvents(in.Events); err != nil {
		return err
	}
	return s.checkWebhookURL(ctx, in.URL)
}

// checkWebhookURL validates an endpoint's URL: its length, and its address
// against server-side request forgery (webhook.CheckURL, which resolves the
// host), unless Options.AllowPrivateNetworks. A refusal is a
// *payment.ValidationError on url naming the reason.
func (s *Server) checkWebhookURL(ctx context.Context, url string) error {
	switch {
	case url == "":
		return payment.Invalid("url", "is required: the https URL that receives the events")
	case len(url) > maxWebhookURL:
		return payment.Invalid("url", "is %d bytes long; at most %d", len(url), maxWebhookURL)
	}
	err := webhook.CheckURL(ctx, url, nil, s.opts.AllowPrivateNetworks)
	if errors.Is(err, webhook.ErrForbidden) || errors.Is(err, webhook.ErrUnresolved) {
		// The guard's text names the reason and nothing of this network.
		return payment.Invalid("url", "%s", err.Error())
	}
	return err // nil, or the context's error: the client left
}

func (s *Server) listWebhookEndpoints(w http.ResponseWriter, r *http.Request) {
	es, err := s.backend.WebhookEndpoints(r.Context(), merchantFrom(r.Context()))
	// At most payment.MaxWebhookEndpoints: one page, never more.
	s.answer(w, r, err, payment.Page[payment.WebhookEndpoint]{Items: es})
}

func (s *Server) getWebhookEndpoint(w http.ResponseWriter, r *http.Request) {
	id := pathID(r, "id", payment.PrefixWebhookEndpoint)
	e, err := s.backend.WebhookEndpoint(r.Context(), merchantFrom(r.Context()), id)
	s.answer(w, r, nameMissing(err, "webhook endpoint", chi.URLParam(r, "id")), e)
}

// webhookEndpointUpdate is the body of an update: the members given (null
// reads as absent) are changed, the others left as they are.
type webhookEndpointUpdate struct {
	URL     *string  `json:"url"`
	Events  []string `json:"events"`
	Enabled *bool    `json:"enabled"`
}

// updateWebhookEndpoint changes an endpoint (POST
// /v1/webhook_endpoints/{id}): 200 with the endpoint, without its secret,
// stored and replayed under the key like every POST's answer. A URL or
// events given are checked as at creation, before the key is claimed, so a
// refused URL stores nothing. No body, or {}, changes nothing.
func (s *Server) updateWebhookEndpoint(w http.ResponseWriter, r *http.Request) {
	var in webhookEndpointUpdate
	req, ok := s.readOptionalPost(w, r, &in)
	if !ok {
		return
	}
	if err := s.checkWebhookEndpointUpdate(r.Context(), in); err != nil {
		s.fail(w, r, err)
		return
	}
	id := pathID(r, "id", payment.PrefixWebhookEndpoint)
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		e, err := l.UpdateWebhookEndpoint(ctx, req.MerchantID, id,
			payment.WebhookEndpointUpdate{URL: in.URL, Events: in.Events, Enabled: in.Enabled})
		if err != nil {
			return response{}, nameMissing(err, "webhook endpoint", chi.URLParam(r, "id"))
		}
		return jsonResponse(http.StatusOK, "", e)
	})
}

// checkWebhookEndpointUpdate validates what an update gives, as
// checkWebhookEndpoint validates a new endpoint.
func (s *Server) checkWebhookEndpointUpdate(ctx context.Context, in webhookEndpointUpdate) error {
	if in.Events != nil {
		if err := payment.ValidateWebhookEvents(in.Events); err != nil {
			return err
		}
	}
	if in.URL != nil {
		return s.checkWebhookURL(ctx, *in.URL)
	}
	return nil
}

// deletedObject is the answer to a DELETE: what was deleted.
type deletedObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

// deleteWebhookEndpoint deletes an endpoint (DELETE
// /v1/webhook_endpoints/{id}). It takes no Idempotency-Key: deleting twice
// deletes once, and the repeat answers 404 as for any unknown endpoint.
func (s *Server) deleteWebhookEndpoint(w http.ResponseWriter, r *http.Request) {
	id := pathID(r, "id", payment.PrefixWebhookEndpoint)
	err := s.backend.DeleteWebhookEndpoint(r.Context(), merchantFrom(r.Context()), id)
	s.answer(w, r, nameMissing(err, "webhook endpoint", chi.URLParam(r, "id")),
		deletedObject{ID: payment.FormatID(payment.PrefixWebhookEndpoint, id), Object: "webhook_endpoint", Deleted: true})
}

// listWebhookAttempts pages the record of an endpoint's delivery attempts
// (GET /v1/webhook_endpoints/{id}/attempts), newest first. A deleted
// endpoint's are 404, as the endpoint is.
func (s *Server) listWebhookAttempts(w http.ResponseWriter, r *http.Request) {
	q, err := parseListQuery(r, payment.PrefixWebhookAttempt)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	id := pathID(r, "id", payment.PrefixWebhookEndpoint)
	page, err := s.backend.WebhookAttempts(r.Context(), merchantFrom(r.Context()), id,
		payment.AttemptQuery{Limit: q.limit, StartingAfter: q.startingAfter})
	s.answer(w, r, nameMissing(err, "webhook endpoint", chi.URLParam(r, "id")), page)
}

// resendWebhookEvent schedules an event for delivery to an endpoint again
// (POST /v1/webhook_endpoints/{id}/events/{eventID}/resend): 202, stored
// and replayed under the key like every POST's answer.
func (s *Server) resendWebhookEvent(w http.ResponseWriter, r *http.Request) {
	var in struct{}
	req, ok := s.readOptionalPost(w, r, &in)
	if !ok {
		return
	}
	endpointID := pathID(r, "id", payment.PrefixWebhookEndpoint)
	eventID := pathID(r, "eventID", payment.PrefixEvent)
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		d, err := l.ResendWebhookEvent(ctx, req.MerchantID, endpointID, eventID)
		if err != nil {
			return response{}, err
		}
		return jsonResponse(http.StatusAccepted, "", d)
	})
}
