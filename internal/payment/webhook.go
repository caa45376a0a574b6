package payment

import (
	"encoding/json"
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

// PrefixWebhookAttempt starts a recorded delivery attempt's public id.
const PrefixWebhookAttempt = "wha_"

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
	EventChargeProcessing, EventChargeReversing, EventChargeReversed, EventChargeRequiresReview,
	EventWebhookEndpointDisabled,
}

// The states of a webhook endpoint: it receives deliveries while enabled;
// it is disabled after its deliveries failed for the whole retry period, or
// by its merchant (WebhookEndpointUpdate), who may enable it again.
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
	// Resumed is set only in the answer of the update that enabled the
	// endpoint again: where its deliveries resume.
	Resumed *Resumption
}

// Resumption is where a re-enabled endpoint's deliveries resume: with the
// events committed after it was enabled, which are exactly those that follow
// After in the event feed (/v1/events); After and the events before it are
// not sent, unless resent one by one. After is uuid.Nil when no event of the
// merchant comes before them.
type Resumption struct {
	After uuid.UUID
}

// WebhookEndpointUpdate is a change to an endpoint; a nil field is left as
// it is. URL and Events are checked by the caller (ValidateWebhookEvents,
// and its URL guard) as for a new endpoint.
type WebhookEndpointUpdate struct {
	URL     *string
	Events  []string
	Enabled *bool
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
	// resumes_after: only when Resumed is set, and then null when no event
	// comes before the resumption.
	var resumesAfter *json.RawMessage
	if e.Resumed != nil {
		after := json.RawMessage("null")
		if e.Resumed.After != uuid.Nil {
			after = json.RawMessage(`"` + FormatID(PrefixEvent, e.Resumed.After) + `"`)
		}
		resumesAfter = &after
	}
	return marshal(struct {
		ID           string           `json:"id"`
		Object       string           `json:"object"`
		URL          string           `json:"url"`
		Events       []string         `json:"events"`
		Status       string           `json:"status"`
		Secret       *string          `json:"secret,omitempty"`
		CreatedAt    timestamp        `json:"created_at"`
		ResumesAfter *json.RawMessage `json:"resumes_after,omitempty"`
	}{FormatID(PrefixWebhookEndpoint, e.ID), "webhook_endpoint", e.URL, e.Events, e.Status, secret, timestamp(e.CreatedAt), resumesAfter})
}

// The states of a webhook delivery: pending until an attempt is answered
// with a 2xx (delivered), until its attempts have failed for the whole
// retry period (abandoned, and the endpoint disabled), or until its endpoint
// is deleted or disabled by its merchant (canceled).
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryAbandoned = "abandoned"
	DeliveryCanceled  = "canceled"
)

// FanOut is what one fan-out of events to webhook endpoints did.
type FanOut struct {
	// Created counts the deliveries it created, Leased those of them it
	// leased to its caller.
	Created, Leased int
	// Again says to fan out again soon rather than at the next poll:
	// another fan-out held the lock, or committed events of a merchant with
	// a live endpoint wait above the event horizon, behind a transaction
	// still running, which may write no event and so wake nobody when it
	// ends.
	Again bool
	// Idle says that no endpoint is live and enabled anywhere: until one
	// is, commits need no fan-out, and the poll's suffice.
	Idle bool
}

// FanOutLease is what a fan-out may lease to the Deliverer that runs it of
// the deliveries it creates, within the bounds a claim keeps: per endpoint
// (its in-flight limit, at most PerEndpoint), per merchant, Total in all,
// each for For. A zero Total leases none.
type FanOutLease struct {
	PerEndpoint, PerMerchant, Total int
	For                             time.Duration
}

// WebhookDelivery is an event to POST to an endpoint, as a worker claimed
// it: the claim is leased, and only the claim that holds Claim settles it.
type WebhookDelivery struct {
	MerchantID uuid.UUID
	EndpointID uuid.UUID
	EventID    uuid.UUID
	URL        string
	Secret     string
	// Body is the event as /v1/events shows it (Event's MarshalJSON).
	Body []byte
	// EventCreatedAt is the event's created_at, as in Body (the metrics'
	// delivery lag counts from it).
	EventCreatedAt time.Time
	// Attempt is this attempt's number, 1 for the first.
	Attempt int
	// Claim is the claim's token.
	Claim uuid.UUID
	// EndpointFailures is how many of the endpoint's attempts had failed in
	// a row when it was claimed, and EndpointInFlight how many of its
	// deliveries it could have in flight: the Deliverer draws the pause
	// after a failure from the one, and grows the other after a 2xx.
	EndpointFailures int
	EndpointInFlight int
}

// WebhookAttempt is what became of one attempt of a delivery, and what
// follows a failure.
type WebhookAttempt struct {
	// ID names the attempt in the record: recording it again (after a
	// commit whose answer was lost) records it once.
	ID uuid.UUID
	// At is when the POST started; Latency how long it took to its answer
	// or its failure.
	At      time.Time
	Latency time.Duration
	// Status is the answer's HTTP status, or 0 when there was none; Error
	// then says why (refused, timed out, ...). One of the two is set.
	Status int
	Error  string
	// RetryIn is how long after a failure the next attempt is due;
	// RetryFor is how long after its first attempt a delivery that keeps
	// failing is abandoned, and its endpoint disabled.
	RetryIn  time.Duration
	RetryFor time.Duration
	// PauseFor is how long after a failure its endpoint gets no attempt at
	// all (then one, a probe, until a 2xx); InFlightUpTo how far a 2xx may
	// grow the number of the endpoint's deliveries in flight at once.
	PauseFor     time.Duration
	InFlightUpTo int
}

// WebhookOutcome is an attempt made of a claimed delivery, to record.
type WebhookOutcome struct {
	Delivery WebhookDelivery
	Attempt  WebhookAttempt
}

// Delivered reports whether the attempt delivered the event: a 2xx answer.
func (a WebhookAttempt) Delivered() bool {
	return a.Error == "" && a.Status >= 200 && a.Status < 300
}

// RecordedAttempt is one attempt of a delivery as the merchant reads it
// (GET /v1/webhook_endpoints/{id}/attempts): its answer's status, or the
// error that stood for one.
type RecordedAttempt struct {
	ID         uuid.UUID
	EndpointID uuid.UUID
	EventID    uuid.UUID
	At         time.Time
	Status     *int
	Error      *string
	Latency    time.Duration
}

// MarshalJSON renders the attempt as the API shows it.
func (a RecordedAttempt) MarshalJSON() ([]byte, error) {
	return marshal(struct {
		ID         string    `json:"id"`
		Object     string    `json:"object"`
		EndpointID string    `json:"endpoint_id"`
		EventID    string    `json:"event_id"`
		At         timestamp `json:"attempted_at"`
		Status     *int      `json:"status"`
		Error      *string   `json:"error"`
		LatencyMS  int64     `json:"latency_ms"`
	}{FormatID(PrefixWebhookAttempt, a.ID), "webhook_attempt", FormatID(PrefixWebhookEndpoint, a.EndpointID),
		FormatID(PrefixEvent, a.EventID), timestamp(a.At), a.Status, a.Error, a.Latency.Milliseconds()})
}

// AttemptQuery selects a page of an endpoint's attempts, newest first.
type AttemptQuery struct {
	Limit         int
	StartingAfter *uuid.UUID // the last attempt of the previous page, or nil
}

// ScheduledDelivery is a delivery a resend scheduled: the event, due now
// to the endpoint, in State (DeliveryPending).
type ScheduledDelivery struct {
	EndpointID uuid.UUID
	EventID    uuid.UUID
	State      string
}

// MarshalJSON renders the delivery as the API shows it.
func (d ScheduledDelivery) MarshalJSON() ([]byte, error) {
	return marshal(struct {
		Object     string `json:"object"`
		EndpointID string `json:"endpoint_id"`
		EventID    string `json:"event_id"`
		State      string `json:"state"`
	}{"webhook_delivery", FormatID(PrefixWebhookEndpoint, d.EndpointID), FormatID(PrefixEvent, d.EventID), d.State})
}
