package payment

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestValidateWebhookEvents(t *testing.T) {
	cases := []struct {
		events []string
		want   string // "" when valid, else a part of the message
	}{
		{[]string{"*"}, ""},
		{[]string{"charge.succeeded", "refund.created"}, ""},
		{EventTypes, ""},
		{nil, "must list"},
		{[]string{}, "must list"},
		{[]string{"*", "charge.succeeded"}, "send it alone"},
		{[]string{"charge.succeeded", "charge.succeeded"}, "listed twice"},
		{[]string{"charge.refunded"}, `"charge.refunded" is not an event type`},
		{[]string{"Charge.Succeeded"}, "is not an event type"},
		{[]string{""}, "is not an event type"},
	}
	for _, tc := range cases {
		err := ValidateWebhookEvents(tc.events)
		var ve *ValidationError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.events, err)
		case tc.want != "" && (!errors.As(err, &ve) || ve.Field != "events" || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want a validation error of events containing %q", tc.events, err, tc.want)
		}
	}
}

func TestWebhookEndpointSubscribes(t *testing.T) {
	all := WebhookEndpoint{Events: []string{AllEvents}}
	some := WebhookEndpoint{Events: []string{EventChargeCaptured}}
	if !all.Subscribes(EventRefundCreated) || !some.Subscribes(EventChargeCaptured) || some.Subscribes(EventChargeSucceeded) {
		t.Errorf("all: %t, some (captured): %t, some (succeeded): %t", all.Subscribes(EventRefundCreated),
			some.Subscribes(EventChargeCaptured), some.Subscribes(EventChargeSucceeded))
	}
}

// The secret is rendered only when set: in the answer that created the
// endpoint, never in a list or a read.
func TestWebhookEndpointJSON(t *testing.T) {
	id := uuid.MustParse("01936b2e-8f3a-7c4d-9e5f-0a1b2c3d4e5f")
	e := WebhookEndpoint{ID: id, URL: "https://shop.example/hooks", Events: []string{"*"}, Status: WebhookEnabled,
		Secret: "whsec_abc", CreatedAt: time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC)}
	created, err := e.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"we_01936b2e8f3a7c4d9e5f0a1b2c3d4e5f","object":"webhook_endpoint","url":"https://shop.example/hooks",` +
		`"events":["*"],"status":"enabled","secret":"whsec_abc","created_at":"2026-12-02T10:00:00.123456Z"}`
	if string(created) != want {
		t.Errorf("created:\n got %s\nwant %s", created, want)
	}
	e.Secret = ""
	listed, err := e.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(listed), "secret") {
		t.Errorf("listed endpoint shows a secret: %s", listed)
	}
}
