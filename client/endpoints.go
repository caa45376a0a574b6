package client

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"strconv"
)

// CreateWebhookEndpoint records an endpoint that is to receive the
// merchant's events (POST /v1/webhook_endpoints); the answer's Secret, which
// signs the deliveries, is shown by this call only (and by its replays): keep
// it. Refusals are a *Problem: CodeInvalidRequest with Field "url" (not
// https, or not a public address) or "events", and
// CodeTooManyWebhookEndpoints past 16; a *RetryError says it gave up
// retrying.
func (c *Client) CreateWebhookEndpoint(ctx context.Context, in NewWebhookEndpoint, opts ...CallOption) (*Result[WebhookEndpoint], error) {
	return post[WebhookEndpoint](ctx, c, "/v1/webhook_endpoints", in, opts)
}

// ListWebhookEndpoints reads all of the merchant's endpoints (at most 16, one
// page), oldest first, without their secrets. Errors as for GetAccount.
func (c *Client) ListWebhookEndpoints(ctx context.Context) (*Result[WebhookEndpointList], error) {
	return get[WebhookEndpointList](ctx, c, "/v1/webhook_endpoints", nil)
}

// GetWebhookEndpoint reads one endpoint, without its secret. Errors as for
// GetAccount.
func (c *Client) GetWebhookEndpoint(ctx context.Context, id WebhookEndpointID) (*Result[WebhookEndpoint], error) {
	return get[WebhookEndpoint](ctx, c, "/v1/webhook_endpoints/"+url.PathEscape(id), nil)
}

// UpdateWebhookEndpoint changes an endpoint (POST
// /v1/webhook_endpoints/{id}): the fields of in that are set, the others
// left as they are; a zero in changes nothing. Enabled false disables it and
// cancels its pending deliveries; Enabled true enables a disabled one, which
// resumes with the events committed from then on: the answer's ResumesAfter
// is the last event it does not receive (nil when none comes before, or
// when the update did not enable it). Refusals are a *Problem:
// CodeInvalidRequest with Field "url" or "events" as for
// CreateWebhookEndpoint, CodeNotFound for an unknown or deleted endpoint; a
// *RetryError says it gave up retrying.
func (c *Client) UpdateWebhookEndpoint(ctx context.Context, id WebhookEndpointID, in UpdateWebhookEndpoint, opts ...CallOption) (*Result[WebhookEndpoint], error) {
	return post[WebhookEndpoint](ctx, c, "/v1/webhook_endpoints/"+url.PathEscape(id), in, opts)
}

// DeleteWebhookEndpoint deletes an endpoint (DELETE
// /v1/webhook_endpoints/{id}) and cancels its pending deliveries. It sends
// no Idempotency-Key: deleting twice deletes once, and an unknown or
// already deleted endpoint is a *Problem
// with Code CodeNotFound. After a lost answer it retries like a read, so a
// CodeNotFound with Result.Attempts above 1 most likely means an earlier
// attempt deleted it.
func (c *Client) DeleteWebhookEndpoint(ctx context.Context, id WebhookEndpointID) (*Result[DeletedWebhookEndpoint], error) {
	res := &Result[DeletedWebhookEndpoint]{}
	return res, do(ctx, c, http.MethodDelete, "/v1/webhook_endpoints/"+url.PathEscape(id), "", nil, res)
}

// ListWebhookAttempts reads one page of the record of an endpoint's
// delivery attempts, newest first. Continue with StartingAfter set to the
// last attempt's id while HasMore is true, or use WebhookAttempts. A deleted
// or unknown endpoint is a *Problem with Code CodeNotFound; other errors as
// for GetAccount.
func (c *Client) ListWebhookAttempts(ctx context.Context, endpointID WebhookEndpointID, p ListWebhookAttemptsParams) (*Result[WebhookAttemptList], error) {
	q := url.Values{}
	setQuery(q, "starting_after", p.StartingAfter)
	if p.Limit != nil {
		q.Set("limit", strconv.Itoa(*p.Limit))
	}
	return getAs[WebhookAttemptList](ctx, c, "/v1/webhook_endpoints/"+url.PathEscape(endpointID)+"/attempts", q, p.XRequestID)
}

// WebhookAttempts iterates over every attempt that ListWebhookAttempts would
// page through from p, fetching the pages as it goes. It stops at the first
// error, which it yields with a zero WebhookAttempt.
func (c *Client) WebhookAttempts(ctx context.Context, endpointID WebhookEndpointID, p ListWebhookAttemptsParams) iter.Seq2[WebhookAttempt, error] {
	return func(yield func(WebhookAttempt, error) bool) {
		for {
			res, err := c.ListWebhookAttempts(ctx, endpointID, p)
			if err != nil {
				yield(WebhookAttempt{}, err)
				return
			}
			for _, a := range res.Data.Data {
				if !yield(a, nil) {
					return
				}
			}
			if !res.Data.HasMore || len(res.Data.Data) == 0 {
				return
			}
			last := res.Data.Data[len(res.Data.Data)-1].ID
			p.StartingAfter = &last
		}
	}
}

// ResendWebhookEvent schedules an event for delivery to an endpoint again,
// due now (POST /v1/webhook_endpoints/{id}/events/{event_id}/resend); it is
// sent with the same event id and a fresh signature. Refusals are a
// *Problem: CodeNotFound for an unknown endpoint, an unknown event or one
// the endpoint does not subscribe to, CodeInvalidRequest for a disabled
// endpoint; a *RetryError says it gave up retrying.
func (c *Client) ResendWebhookEvent(ctx context.Context, endpointID WebhookEndpointID, eventID EventID, opts ...CallOption) (*Result[WebhookDelivery], error) {
	return post[WebhookDelivery](ctx, c, "/v1/webhook_endpoints/"+url.PathEscape(endpointID)+"/events/"+url.PathEscape(eventID)+"/resend",
		ResendWebhookEvent{}, opts)
}
