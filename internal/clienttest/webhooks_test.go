package clienttest_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/exactlyonce/payments/client"
)

// The four endpoint methods against the real service: a creation whose
// answer is lost completes on the retry with the same secret, reads never
// show it, and a deleted endpoint is not found.
func TestWebhookEndpoints(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	lost := &loseFirst{next: http.DefaultTransport}
	c := f.client(f.url, client.WithHTTPClient(&http.Client{Transport: lost}), client.WithRetryPolicy(fast))
	in := client.NewWebhookEndpoint{URL: "https://93.184.215.14/hooks", Events: []string{"charge.succeeded", "charge.failed"}}
	created, err := c.CreateWebhookEndpoint(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	e := created.Data
	if !created.Replayed || created.Attempts != 2 || created.Location != "/v1/webhook_endpoints/"+e.ID {
		t.Errorf("Replayed %v, Attempts %d, Location %q; want a replay on the 2nd attempt", created.Replayed, created.Attempts, created.Location)
	}
	if e.Secret == nil || len(*e.Secret) != len("whsec_")+43 || e.Status != client.WebhookEndpointStatusEnabled || e.URL != in.URL {
		t.Errorf("created %+v", e)
	}
	if a := lost.all(); len(a) != 2 || a[0].key != a[1].key || a[0].key != created.IdempotencyKey {
		t.Errorf("attempts %d, want 2 with the key %s", len(a), created.IdempotencyKey)
	}
	var rows int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE merchant_id = $1`, f.merchantID).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("%d endpoint rows (%v), want 1", rows, err)
	}

	c = f.client(f.url)
	list, err := c.ListWebhookEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Data.Data) != 1 || list.Data.HasMore || list.Data.Data[0].ID != e.ID || list.Data.Data[0].Secret != nil {
		t.Errorf("list %+v, want the endpoint without its secret", list.Data)
	}
	got, err := c.GetWebhookEndpoint(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Data.ID != e.ID || got.Data.Secret != nil || len(got.Data.Events) != 2 {
		t.Errorf("get %+v, want the endpoint without its secret", got.Data)
	}

	deleted, err := c.DeleteWebhookEndpoint(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if deleted.Data.ID != e.ID || !deleted.Data.Deleted || deleted.Data.Object != client.DeletedWebhookEndpointObjectWebhookEndpoint {
		t.Errorf("delete %+v", deleted.Data)
	}
	var prob *client.Problem
	if _, err := c.DeleteWebhookEndpoint(ctx, e.ID); !errors.As(err, &prob) || prob.Code != client.CodeNotFound {
		t.Errorf("second delete: %v, want a not-found problem", err)
	}
	if _, err := c.GetWebhookEndpoint(ctx, e.ID); !errors.As(err, &prob) || prob.Code != client.CodeNotFound {
		t.Errorf("get after delete: %v, want a not-found problem", err)
	}
}

// A refused URL is a *Problem naming the field, and is not retried.
func TestWebhookEndpointRefused(t *testing.T) {
	f := setup(t)
	c := f.client(f.url, client.WithRetryPolicy(fast))
	res, err := c.CreateWebhookEndpoint(context.Background(), client.NewWebhookEndpoint{URL: "https://localhost/hooks", Events: []string{"*"}})
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Code != client.CodeInvalidRequest || prob.Field != "url" || res.Attempts != 1 {
		t.Fatalf("%v (attempts %d), want one invalid-request on url", err, res.Attempts)
	}
}

// The attempts list pages through the client's iterator, newest first; a
// resend answers the pending delivery; an event that is not the
// merchant's is not found.
func TestWebhookAttemptsAndResend(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	c := f.client(f.url)
	e, err := c.CreateWebhookEndpoint(ctx, client.NewWebhookEndpoint{URL: "https://93.184.215.14/hooks", Events: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	f.fundedAccount(0)
	f.waitForEvents(c, map[client.EventType]int{client.EventTypeAccountCreated: 1})
	events, err := c.ListEvents(ctx, client.ListEventsParams{})
	if err != nil {
		t.Fatal(err)
	}
	event := events.Data.Data[0].ID
	// Three recorded attempts, a second apart: 500, an error, 200.
	if _, err := f.db.Exec(ctx, `
INSERT INTO webhook_attempts (merchant_id, endpoint_id, id, event_id, attempted_at, status, error, latency_ms)
SELECT w.merchant_id, w.id, gen_random_uuid(), ev.id, now() - make_interval(secs => 3 - n), s, er, 7
FROM webhook_endpoints w, events ev,
     (VALUES (0, 500, NULL), (1, NULL, 'connection refused'), (2, 200, NULL)) AS a(n, s, er)
WHERE w.merchant_id = $1 AND ev.merchant_id = $1 AND ev.type = 'account.created'`, f.merchantID); err != nil {
		t.Fatal(err)
	}
	var got []string
	for a, err := range c.WebhookAttempts(ctx, e.Data.ID, client.ListWebhookAttemptsParams{Limit: &[]int{2}[0]}) {
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case a.Status != nil:
			got = append(got, strconv.Itoa(*a.Status))
		case a.Error != nil:
			got = append(got, *a.Error)
		}
	}
	if want := []string{"200", "connection refused", "500"}; !slices.Equal(got, want) {
		t.Errorf("attempts %v, want %v", got, want)
	}

	res, err := c.ResendWebhookEvent(ctx, e.Data.ID, event)
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Data; d.State != client.WebhookDeliveryStatePending || d.EventID != event || d.EndpointID != e.Data.ID ||
		d.Object != client.WebhookDeliveryObjectWebhookDelivery {
		t.Errorf("resend %+v", d)
	}
	var prob *client.Problem
	if _, err := c.ResendWebhookEvent(ctx, e.Data.ID, "evt_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b"); !errors.As(err, &prob) || prob.Code != client.CodeNotFound {
		t.Errorf("resend of an unknown event: %v, want a not-found problem", err)
	}
}

// UpdateWebhookEndpoint against the real service: a disabling whose answer
// is lost completes on the retry, which replays the answer byte for byte;
// enabling again says the last event the endpoint does not receive; a
// refused URL is a *Problem on url, not retried, and changes nothing.
func TestUpdateWebhookEndpoint(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	c := f.client(f.url)
	e, err := c.CreateWebhookEndpoint(ctx, client.NewWebhookEndpoint{URL: "https://93.184.215.14/hooks", Events: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	id := e.Data.ID
	status := func() string {
		t.Helper()
		var s string
		if err := f.db.QueryRow(ctx, `SELECT status || ' ' || url FROM webhook_endpoints WHERE merchant_id = $1`, f.merchantID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	lost := &loseFirst{next: http.DefaultTransport}
	disabled, err := f.client(f.url, client.WithHTTPClient(&http.Client{Transport: lost}), client.WithRetryPolicy(fast)).
		UpdateWebhookEndpoint(ctx, id, client.UpdateWebhookEndpoint{Enabled: &[]bool{false}[0]})
	if err != nil {
		t.Fatal(err)
	}
	if a := lost.all(); !disabled.Replayed || len(a) != 2 || a[0].key != a[1].key || a[0].status != http.StatusOK || !bytes.Equal(a[0].answer, a[1].answer) {
		t.Errorf("Replayed %v after %d attempts; want the lost answer replayed byte for byte on the 2nd", disabled.Replayed, len(a))
	}
	if d := disabled.Data; d.Status != client.WebhookEndpointStatusDisabled || d.Secret != nil || d.ResumesAfter != nil {
		t.Errorf("disabled %+v", d)
	}
	if got := status(); got != "disabled https://93.184.215.14/hooks" {
		t.Errorf("row %q after disabling", got)
	}

	f.fundedAccount(0)
	f.waitForEvents(c, map[client.EventType]int{client.EventTypeAccountCreated: 1})
	events, err := c.ListEvents(ctx, client.ListEventsParams{})
	if err != nil {
		t.Fatal(err)
	}
	last := events.Data.Data[len(events.Data.Data)-1].ID
	enabled, err := c.UpdateWebhookEndpoint(ctx, id, client.UpdateWebhookEndpoint{Enabled: &[]bool{true}[0]})
	if err != nil {
		t.Fatal(err)
	}
	if d := enabled.Data; d.Status != client.WebhookEndpointStatusEnabled || d.ResumesAfter == nil || *d.ResumesAfter != last {
		t.Errorf("enabled %+v, want it to resume after %s", d, last)
	}

	var prob *client.Problem
	res, err := f.client(f.url, client.WithRetryPolicy(fast)).UpdateWebhookEndpoint(ctx, id, client.UpdateWebhookEndpoint{URL: &[]string{"https://localhost/hooks"}[0]})
	if !errors.As(err, &prob) || prob.Code != client.CodeInvalidRequest || prob.Field != "url" || res.Attempts != 1 {
		t.Errorf("%v (attempts %d), want one invalid-request on url", err, res.Attempts)
	}
	if got := status(); got != "enabled https://93.184.215.14/hooks" {
		t.Errorf("row %q after the refused URL", got)
	}
	if _, err := c.UpdateWebhookEndpoint(ctx, "we_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b", client.UpdateWebhookEndpoint{}); !errors.As(err, &prob) || prob.Code != client.CodeNotFound {
		t.Errorf("update of an unknown endpoint: %v, want a not-found problem", err)
	}
}
