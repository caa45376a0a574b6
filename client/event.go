package client

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/url"
	"strconv"
)

// ListEvents reads one page of the event feed, oldest first; continue with
// StartingAfter set to the last event's id. The feed may not yet hold the
// events of changes that just committed. Errors as for GetAccount.
func (c *Client) ListEvents(ctx context.Context, p ListEventsParams) (*Result[EventList], error) {
	q := url.Values{}
	setQuery(q, "starting_after", p.StartingAfter)
	if p.Limit != nil {
		q.Set("limit", strconv.Itoa(*p.Limit))
	}
	return getAs[EventList](ctx, c, "/v1/events", q, p.XRequestID)
}

// Events iterates over the event feed from p, oldest first, fetching the
// pages as it goes, until a page says no more follow (events committed
// later are for a next call, from the last id seen). It stops at the first
// error, which it yields with a zero Event.
func (c *Client) Events(ctx context.Context, p ListEventsParams) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		for {
			res, err := c.ListEvents(ctx, p)
			if err != nil {
				yield(Event{}, err)
				return
			}
			for _, e := range res.Data.Data {
				if !yield(e, nil) {
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

// GetEvent reads one event, exactly as ListEvents lists it. An event the
// feed does not list yet (its change just committed) is a *Problem with
// CodeNotFound until it does, as is one pruned from the feed or another
// merchant's. Errors as for GetAccount.
func (c *Client) GetEvent(ctx context.Context, id EventID) (*Result[Event], error) {
	return get[Event](ctx, c, "/v1/events/"+url.PathEscape(id), nil)
}

// EventData is an event's data: the object the event describes, as it was
// when the event happened. Its Discriminator (the object's "object" field)
// says which kind it is; read it with the matching As method:
//
//	switch kind, _ := e.Data.Discriminator(); kind {
//	case "charge":
//		ch, err := e.Data.AsCharge()
//		...
//	}
//
// The bytes are kept as the service sent them, so an object of a kind this
// version of the client does not know is not lost: MarshalJSON writes it back.
type EventData struct {
	raw json.RawMessage
}

// Discriminator is the kind of the object: "account", "deposit", "charge",
// "refund" or "webhook_endpoint".
func (d EventData) Discriminator() (string, error) {
	var o struct {
		Object string `json:"object"`
	}
	if err := json.Unmarshal(d.raw, &o); err != nil {
		return "", fmt.Errorf("event data: %w", err)
	}
	return o.Object, nil
}

// AsAccount decodes the data as an Account.
func (d EventData) AsAccount() (Account, error) { return decodeAs[Account](d) }

// AsDeposit decodes the data as a Deposit.
func (d EventData) AsDeposit() (Deposit, error) { return decodeAs[Deposit](d) }

// AsCharge decodes the data as a Charge.
func (d EventData) AsCharge() (Charge, error) { return decodeAs[Charge](d) }

// AsRefund decodes the data as a Refund.
func (d EventData) AsRefund() (Refund, error) { return decodeAs[Refund](d) }

// AsWebhookEndpoint decodes the data as a WebhookEndpoint (the data of
// webhook_endpoint.disabled).
func (d EventData) AsWebhookEndpoint() (WebhookEndpoint, error) { return decodeAs[WebhookEndpoint](d) }

// ValueByDiscriminator decodes the data as the kind its Discriminator
// names: an Account, a Deposit, a Charge, a Refund or a WebhookEndpoint.
func (d EventData) ValueByDiscriminator() (any, error) {
	kind, err := d.Discriminator()
	if err != nil {
		return nil, err
	}
	switch kind {
	case "account":
		return d.AsAccount()
	case "deposit":
		return d.AsDeposit()
	case "charge":
		return d.AsCharge()
	case "refund":
		return d.AsRefund()
	case "webhook_endpoint":
		return d.AsWebhookEndpoint()
	default:
		return nil, fmt.Errorf("event data: unknown object %q", kind)
	}
}

// MarshalJSON writes the data's bytes as received.
func (d EventData) MarshalJSON() ([]byte, error) {
	if d.raw == nil {
		return []byte("null"), nil
	}
	return d.raw, nil
}

// UnmarshalJSON keeps a copy of the data's bytes.
func (d *EventData) UnmarshalJSON(b []byte) error {
	d.raw = append(d.raw[:0], b...)
	return nil
}

func decodeAs[T any](d EventData) (T, error) {
	var v T
	if err := json.Unmarshal(d.raw, &v); err != nil {
		return v, fmt.Errorf("event data: %w", err)
	}
	return v, nil
}
