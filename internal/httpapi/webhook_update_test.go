package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// endpointRow is what the table holds of the fixture's merchant's endpoint:
// what an update may change, and the fan-out's cursor.
func (f *fixture) endpointRow(id string) string {
	f.t.Helper()
	var row string
	if err := f.db.QueryRow(context.Background(), `SELECT concat_ws(' ', url, events::text, status, cursor_tx::text, cursor_seq, deleted_at IS NOT NULL)
FROM webhook_endpoints WHERE merchant_id = $1 AND 'we_' || replace(id::text, '-', '') = $2`, f.merchantID, id).Scan(&row); err != nil {
		f.t.Fatal(err)
	}
	return row
}

// deliveryStates counts the endpoint's deliveries by state, as "state=n"
// in the order of the states' names.
func (f *fixture) deliveryStates(id string) string {
	f.t.Helper()
	var states string
	if err := f.db.QueryRow(context.Background(), `SELECT coalesce(string_agg(state || '=' || n, ' ' ORDER BY state), '') FROM (
    SELECT state, count(*) AS n FROM webhook_deliveries
    WHERE merchant_id = $1 AND 'we_' || replace(endpoint_id::text, '-', '') = $2 GROUP BY state) s`, f.merchantID, id).Scan(&states); err != nil {
		f.t.Fatal(err)
	}
	return states
}

// fanOut fans the committed events out to the endpoints, as a Deliverer
// would. The fixture must have a database of its own.
func (f *fixture) fanOut() {
	f.t.Helper()
	if _, err := f.store.FanOut(context.Background(), 100); err != nil {
		f.t.Fatal(err)
	}
}

// lastEvent is the id of the merchant's last event in the feed.
func (f *fixture) lastEvent() string {
	f.t.Helper()
	var id string
	if err := f.db.QueryRow(context.Background(), `SELECT 'evt_' || replace(id::text, '-', '') FROM events
WHERE merchant_id = $1 ORDER BY tx_id DESC, seq DESC LIMIT 1`, f.merchantID).Scan(&id); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// An update changes the members it gives and no other; its answer, stored
// under the key, has no secret, and a retry replays it byte for byte and
// changes nothing more; the same key with another body is refused. {} and
// no body change nothing, and are answered all the same.
func TestWebhookEndpointUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	e := f.createEndpoint(endpointBody(publicHook, "charge.succeeded"))
	id := e["id"].(string)
	path := "/v1/webhook_endpoints/" + id
	before := f.endpointRow(id)

	key, body := uuid.NewString(), `{"url":"`+publicHook+`/v2","events":["*"]}`
	r := f.post(path, key, body)
	want := fmt.Sprintf(`{"id":%q,"object":"webhook_endpoint","url":"%s/v2","events":["*"],"status":"enabled","created_at":%q}`+"\n",
		id, publicHook, e["created_at"])
	if r.status != http.StatusOK || string(r.body) != want || r.header.Get("Location") != "" {
		t.Fatalf("update: %d %s\nwant 200 %s", r.status, r.body, want)
	}
	after := f.endpointRow(id)
	if wantRow := strings.Replace(strings.Replace(before, publicHook, publicHook+"/v2", 1), "{charge.succeeded}", "{*}", 1); after != wantRow {
		t.Errorf("row after the update %q, want %q", after, wantRow)
	}
	again := f.post(path, key, body)
	if again.status != http.StatusOK || !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d replayed=%q %s, want the first answer's bytes", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if status, stored := f.storedResponse(key); status != http.StatusOK || !bytes.Equal(stored, r.body) {
		t.Errorf("stored under the key: %d %s", status, stored)
	}
	if reused := f.post(path, key, `{"enabled":false}`); reused.status != http.StatusUnprocessableEntity || reused.code(t) != "idempotency-key-reused" {
		t.Errorf("the key with another body: %d %s, want 422 idempotency-key-reused", reused.status, reused.body)
	}
	if row := f.endpointRow(id); row != after {
		t.Errorf("row after the replay and the reused key %q, want %q", row, after)
	}

	for name, body := range map[string]string{"{}": "{}", "no body": ""} {
		r := f.post(path, uuid.NewString(), body)
		if r.status != http.StatusOK || !bytes.Equal(r.body, again.body) {
			t.Errorf("update with %s: %d %s, want the endpoint unchanged %s", name, r.status, r.body, again.body)
		}
	}
	if row := f.endpointRow(id); row != after {
		t.Errorf("row after updates that change nothing %q, want %q", row, after)
	}
	if got := f.get(path); !bytes.Equal(got.body, again.body) {
		t.Errorf("read after the update %s, want %s", got.body, again.body)
	}
}

// A URL or events that creation would refuse are refused by an update,
// before its key is claimed: 400 naming the field, nothing stored, the
// endpoint unchanged. An endpoint of another merchant, unknown, or deleted
// is 404, stored under the key.
func TestWebhookEndpointUpdateRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.createEndpoint(endpointBody(publicHook, "*"))["id"].(string)
	path := "/v1/webhook_endpoints/" + id
	before, keys := f.endpointRow(id), f.keys()
	for _, tc := range []struct{ name, body, field, why string }{
		{"loopback", `{"url":"https://127.0.0.1/hook"}`, "url", "loopback"},
		{"a name that resolves to loopback", `{"url":"https://localhost/hook"}`, "url", "loopback"},
		{"link-local", `{"url":"https://169.254.169.254/latest/meta-data"}`, "url", "link-local"},
		{"private", `{"url":"https://10.0.0.1/hook","enabled":false}`, "url", "private"},
		{"not https", `{"url":"http://93.184.215.14/hook"}`, "url", "https"},
		{"empty url", `{"url":""}`, "url", "required"},
		{"too long", `{"url":"https://93.184.215.14/` + strings.Repeat("a", 2048) + `"}`, "url", "2048"},
		{"no events", `{"events":[]}`, "events", `["*"]`},
		{"unknown event", `{"events":["charge.refunded"]}`, "events", "not an event type"},
		{"enabled not a boolean", `{"enabled":"yes"}`, "enabled", "boolean"},
		{"unknown field", `{"disabled":true}`, "disabled", "unknown field"},
		{"the secret", `{"secret":"whsec_mine"}`, "secret", "unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.post(path, uuid.NewString(), tc.body)
			p := r.json(t)
			if r.status != http.StatusBadRequest || r.code(t) != "invalid-request" || p["field"] != tc.field {
				t.Fatalf("%d %s, want 400 invalid-request on field %s", r.status, r.body, tc.field)
			}
			if detail, _ := p["detail"].(string); !strings.Contains(detail, tc.why) {
				t.Errorf("detail %q does not say %q", detail, tc.why)
			}
		})
	}
	if r := f.post(path, "", `{"enabled":false}`); r.status != http.StatusBadRequest || r.code(t) != "idempotency-key-missing" {
		t.Errorf("without a key: %d %s", r.status, r.body)
	}
	if row, n := f.endpointRow(id), f.keys(); row != before || n != keys {
		t.Errorf("after the refusals: row %q and %d keys, want %q and %d", row, n, before, keys)
	}

	g := f.otherMerchant()
	key := uuid.NewString()
	theirs := g.post(path, key, `{"enabled":false}`)
	if theirs.status != http.StatusNotFound || theirs.code(t) != "not-found" {
		t.Errorf("another merchant's update: %d %s, want 404", theirs.status, theirs.body)
	}
	if replay := g.post(path, key, `{"enabled":false}`); !bytes.Equal(replay.body, theirs.body) || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("its replay: %d %s, want the stored 404", replay.status, replay.body)
	}
	if d := f.delete(path); d.status != http.StatusOK {
		t.Fatalf("delete: %d %s", d.status, d.body)
	}
	for what, p := range map[string]string{"deleted": path, "unknown": "/v1/webhook_endpoints/we_" + strings.ReplaceAll(uuid.NewString(), "-", ""),
		"malformed": "/v1/webhook_endpoints/we_nope"} {
		if r := f.post(p, uuid.NewString(), `{"enabled":true}`); r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Errorf("update of a %s endpoint: %d %s, want 404", what, r.status, r.body)
		}
	}
	if row := f.endpointRow(id); row != strings.TrimSuffix(before, "f")+"t" {
		t.Errorf("the deleted endpoint's row %q, want it unchanged but deleted (was %q)", row, before)
	}
}

// Disabling cancels the pending deliveries; the events of the time it is
// disabled are never sent; enabling it again answers where it resumes, and
// the endpoint then receives exactly the feed's events after that one,
// replayed answer included, at its new URL once it is moved. Deleting it
// cancels what is pending.
func TestWebhookEndpointDisableEnable(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.allowPrivate, o.databaseURL = true, pgtest.NewDatabase(t) })
	id := f.createEndpoint(endpointBody("http://127.0.0.1:9/nobody", "account.created"))["id"].(string)
	path := "/v1/webhook_endpoints/" + id
	f.account("USD", 0)
	f.account("USD", 0)
	f.fanOut()
	if got := f.deliveryStates(id); got != "pending=2" {
		t.Fatalf("deliveries before disabling: %s, want 2 pending", got)
	}

	disable := f.post(path, uuid.NewString(), `{"enabled":false}`)
	if disable.status != http.StatusOK || disable.json(t)["status"] != "disabled" || bytes.Contains(disable.body, []byte("resumes_after")) {
		t.Fatalf("disable: %d %s", disable.status, disable.body)
	}
	if got := f.deliveryStates(id); got != "canceled=2" {
		t.Errorf("deliveries after disabling: %s, want 2 canceled", got)
	}
	f.account("USD", 0) // while disabled: never sent
	f.fanOut()
	if got := f.deliveryStates(id); got != "canceled=2" {
		t.Errorf("deliveries of the disabled endpoint after a fan-out: %s, want the 2 canceled only", got)
	}
	if r := f.post(path+"/events/"+f.lastEvent()+"/resend", uuid.NewString(), "{}"); r.status != http.StatusBadRequest {
		t.Errorf("a resend to the disabled endpoint: %d %s, want 400", r.status, r.body)
	}

	lastWhileDisabled := f.lastEvent()
	key := uuid.NewString()
	enable := f.post(path, key, `{"enabled":true}`)
	if e := enable.json(t); enable.status != http.StatusOK || e["status"] != "enabled" || e["resumes_after"] != lastWhileDisabled {
		t.Fatalf("enable: %d %s, want enabled, resuming after %s", enable.status, enable.body, lastWhileDisabled)
	}
	f.account("USD", 0)
	f.fanOut()
	if got := f.deliveryStates(id); got != "canceled=2 pending=1" {
		t.Errorf("deliveries after enabling: %s, want the 2 canceled and 1 pending", got)
	}
	feed := f.get("/v1/events?starting_after=" + lastWhileDisabled).json(t)["data"].([]any)
	resumed := feed[0].(map[string]any)["id"]
	if len(feed) != 1 || resumed != f.lastEvent() {
		t.Errorf("the feed after resumes_after holds %d events, want the 1 committed since", len(feed))
	}
	if again := f.post(path, key, `{"enabled":true}`); !bytes.Equal(again.body, enable.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the enable's replay, after another event: %s, want its first answer %s", again.body, enable.body)
	}
	if r := f.post(path, uuid.NewString(), `{"enabled":true}`); r.status != http.StatusOK || bytes.Contains(r.body, []byte("resumes_after")) {
		t.Errorf("enabling the enabled endpoint: %d %s, want it unchanged, without resumes_after", r.status, r.body)
	}

	// Moved to a receiver, it gets the pending event there, and no other.
	rcv := newReceiver(t, 0)
	if r := f.post(path, uuid.NewString(), `{"url":"`+rcv.url+`"}`); r.status != http.StatusOK {
		t.Fatalf("move: %d %s", r.status, r.body)
	}
	f.deliver()
	if got := rcv.wait(t, 1); got[0] != resumed {
		t.Errorf("delivered %v, want %s", got, resumed)
	}
	time.Sleep(200 * time.Millisecond) // time enough for a canceled delivery to arrive, wrongly
	if got := rcv.wait(t, 1); len(got) != 1 {
		t.Errorf("delivered %v, want only %s", got, resumed)
	}

	// Deleted with deliveries pending (the receiver now fails), they end.
	rcv.mu.Lock()
	rcv.fail = 1 << 30
	rcv.mu.Unlock()
	f.account("USD", 0)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(f.deliveryStates(id), "pending=1"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pending delivery after 10 s: %s", f.deliveryStates(id))
		}
	}
	if d := f.delete(path); d.status != http.StatusOK {
		t.Fatalf("delete: %d %s", d.status, d.body)
	}
	if got := f.deliveryStates(id); got != "canceled=3 delivered=1" {
		t.Errorf("deliveries after the deletion: %s, want 3 canceled and the 1 delivered", got)
	}
}
