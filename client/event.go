package client

import (
	"encoding/json"
	"fmt"
)

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
