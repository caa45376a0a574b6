package payment

import (
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Webhook endpoints: a merchant's HTTPS URL that receives the merchant's
// events of the types it subscribes to, signed with the endpoint's secret
// (docs/webhooks.md has the design; internal/webhook signs and guards the
// deliveries).

// PrefixWebhookEndpoint starts a webhook endpoint's public id.
const PrefixWebhookEndpoint = "we_"

// MaxWebhookEndpoints is how many live endpoints a merchant may have.
const MaxWebhookEndpoints = 16

// AllEvents subscribes an endpoint to every event type, present and future.
const AllEvents = "*"

// EventTypes are the event types an endpoint may subscribe to, every type
// the service writes.
var EventTypes = []string{
	EventAccountCreated, EventDepositCreated,
	EventChargeSucceeded, EventChargeFailed,
	EventChargeAuthorized, EventChargeCaptured, EventChargeVoided, EventChargeExpired,
	EventRefundCreated,
}

// The states of a webhook endpoint: it receives deliveries while enabled;
// it is disabled after its deliveries failed for the whole retry period.
const (
	WebhookEnabled  = "enabled"
	WebhookDisabled = "disabled"
)

// ErrTooManyWebhookEndpoints refuses an endpoint to a merchant that already
// has MaxWebhookEndpoints.
var ErrTooManyWebhookEndpoints = errors.New("too many webhook endpoints")

// WebhookEndpoint is where a merchant's events are delivered.
type WebhookEndpoint struct {
	ID         uuid.UUID
	MerchantID uuid.UUID
	URL        string
	Events     []string // AllEvents alone, or event types
	Status     string
	// Secret signs the deliveries. It is shown once, in the answer that
	// created the endpoint; every other rendering leaves it out.
	Secret    string
	CreatedAt time.Time
}

// Subscribes reports whether the endpoint receives events of eventType.
func (e WebhookEndpoint) Subscribes(eventType string) bool {
	return slices.Contains(e.Events, AllEvents) || slices.Contains(e.Events, eventType)
}

// ValidateWebhookEvents checks an endpoint's subscription: AllEvents alone,
// or one or more distinct event types of EventTypes.
func ValidateWebhookEvents(events []string) error {
	switch {
	case len(events) == 0:
		return Invalid("events", `must list the event types to receive, or be ["*"] for all`)
	case slices.Contains(events, AllEvents) && len(events) > 1:
		return Invalid("events", `"*" already means every event type; send it alone`)
	case slices.Contains(events, AllEvents):
		return nil
	}
	for i, t := range events {
		if !slices.Contains(EventTypes, t) {
			return Invalid("events", "%q is not an event type; the types are %v", t, EventTypes)
		}
		if slices.Contains(events[:i], t) {
			return Invalid("events", "%q is listed twice", t)
		}
	}
	return nil
}

// MarshalJSON renders the endpoint as the API shows it: with its secret
// only when Secret is set (the answer that created it).
func (e WebhookEndpoint) MarshalJSON() ([]byte, error) {
	var secret *string
	if e.Secret != "" {
		secret = &e.Secret
	}
	return marshal(struct {
		ID        string    `json:"id"`
		Object    string    `json:"object"`
		URL       string    `json:"url"`
		Events    []string  `json:"events"`
		Status    string    `json:"status"`
		Secret    *string   `json:"secret,omitempty"`
		CreatedAt timestamp `json:"created_at"`
	}{FormatID(PrefixWebhookEndpoint, e.ID), "webhook_endpoint", e.URL, e.Events, e.Status, secret, timestamp(e.CreatedAt)})
}
