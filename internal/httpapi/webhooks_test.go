package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// publicHook is a URL on a public address given as an IP, so the guard
// needs no DNS to let it through.
const publicHook = "https://93.184.215.14/hooks/payments"

// endpointBody is a creation request for url subscribed to events.
func endpointBody(url string, events ...string) string {
	if events == nil {
		events = []string{} // [], not null
	}
	ev, _ := json.Marshal(events)
	u, _ := json.Marshal(url)
	return `{"url":` + string(u) + `,"events":` + string(ev) + `}`
}

func (f *fixture) delete(path string) reply {
	f.t.Helper()
	return f.do(f.request(http.MethodDelete, path, "", ""))
}

func (f *fixture) endpoints() int {
	return f.count(`SELECT count(*) FROM webhook_endpoints WHERE merchant_id = $1`)
}

// createEndpoint creates an endpoint and returns its answer, failing the test
// on anything but 201.
func (f *fixture) createEndpoint(body string) map[string]any {
	f.t.Helper()
	r := f.post("/v1/webhook_endpoints", uuid.NewString(), body)
	if r.status != http.StatusCreated {
		f.t.Fatalf("create webhook endpoint: %d %s", r.status, r.body)
	}
	return r.json(f.t)
}

// Creation answers the secret once; a replay is the same bytes, secret
// included; a list and a read show the endpoint without it.
func TestWebhookEndpointCreateListGet(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key, body := uuid.NewString(), endpointBody(publicHook, "charge.succeeded", "refund.created")
	first := f.post("/v1/webhook_endpoints", key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("create: %d %s", first.status, first.body)
	}
	e := first.json(t)
	id, _ := e["id"].(string)
	secret, _ := e["secret"].(string)
	if !strings.HasPrefix(id, "we_") || e["object"] != "webhook_endpoint" || e["url"] != publicHook ||
		e["status"] != "enabled" || e["created_at"] == nil || fmt.Sprint(e["events"]) != "[charge.succeeded refund.created]" {
		t.Errorf("created endpoint %s", first.body)
	}
	if !strings.HasPrefix(secret, "whsec_") || len(secret) != len("whsec_")+43 {
		t.Errorf("secret %q, want whsec_ and 43 base64url characters", secret)
	}
	if loc := first.header.Get("Location"); loc != "/v1/webhook_endpoints/"+id {
		t.Errorf("Location %q, want /v1/webhook_endpoints/%s", loc, id)
	}

	again := f.post("/v1/webhook_endpoints", key, body)
	if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d replayed=%q\n%s\nwant the first answer's bytes\n%s", again.status, again.header.Get("Idempotent-Replayed"), again.body, first.body)
	}
	if n := f.endpoints(); n != 1 {
		t.Errorf("%d endpoints stored, want 1", n)
	}
	var stored string
	if err := f.db.QueryRow(t.Context(), `SELECT secret FROM webhook_endpoints WHERE merchant_id = $1`, f.merchantID).Scan(&stored); err != nil || stored != secret {
		t.Errorf("stored secret %q (%v), want the one answered", stored, err)
	}

	list := f.get("/v1/webhook_endpoints")
	var page struct {
		Object  string           `json:"object"`
		Data    []map[string]any `json:"data"`
		HasMore bool             `json:"has_more"`
	}
	if err := json.Unmarshal(list.body, &page); err != nil || list.status != http.StatusOK {
		t.Fatalf("list: %d %s (%v)", list.status, list.body, err)
	}
	if page.Object != "list" || page.HasMore || len(page.Data) != 1 || page.Data[0]["id"] != id {
		t.Errorf("list %s, want the one endpoint", list.body)
	}
	got := f.get("/v1/webhook_endpoints/" + id)
	if got.status != http.StatusOK || got.json(t)["id"] != id {
		t.Errorf("get: %d %s", got.status, got.body)
	}
	for what, b := range map[string][]byte{"list": list.body, "get": got.body} {
		if bytes.Contains(b, []byte("secret")) || bytes.Contains(b, []byte(secret)) {
			t.Errorf("the %s shows the secret: %s", what, b)
		}
	}
}

// With WEBHOOK_ALLOW_PRIVATE_NETWORKS off, a URL the service must not send
// to is refused before the key is claimed: 400 naming the field and why,
// and nothing stored, neither the key nor an endpoint.
func TestWebhookEndpointURLRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, tc := range []struct{ url, why string }{
		{"http://127.0.0.1/hook", "https"},
		{"http://[::1]/hook", "https"},
		{"http://10.0.0.1/hook", "https"},
		{"http://169.254.169.254/latest/meta-data", "https"},
		{"https://127.0.0.1/hook", "loopback"},
		{"https://[::1]/hook", "loopback"},
		{"https://10.0.0.1/hook", "private"},
		{"https://169.254.169.254/latest/meta-data", "link-local"},
		{"https://localhost/hook", "loopback"}, // a name that resolves to loopback
		{"https://user:pw@93.184.215.14/hook", "user"},
		{"ftp://93.184.215.14/hook", "https"},
		{"hooks.example/path", "https"},
		{"", "required"},
		{"https://93.184.215.14/" + strings.Repeat("a", 2048), "2048"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			key := uuid.NewString()
			r := f.post("/v1/webhook_endpoints", key, endpointBody(tc.url, "*"))
			p := r.json(t)
			if r.status != http.StatusBadRequest || r.code(t) != "invalid-request" || p["field"] != "url" {
				t.Fatalf("%d %s, want 400 invalid-request on field url", r.status, r.body)
			}
			if detail, _ := p["detail"].(string); !strings.Contains(detail, tc.why) {
				t.Errorf("detail %q does not say %q", detail, tc.why)
			}
			if n := f.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`, key); n != 0 {
				t.Errorf("the refused request's key was stored")
			}
		})
	}
	if n := f.endpoints(); n != 0 {
		t.Errorf("%d endpoints stored, want none", n)
	}
}

// The setting lets local receivers through, for development and tests.
func TestWebhookEndpointAllowPrivate(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.allowPrivate = true })
	for _, u := range []string{"http://127.0.0.1:9/hook", "http://localhost:9/hook", "https://10.0.0.1/hook"} {
		if e := f.createEndpoint(endpointBody(u, "*")); e["url"] != u {
			t.Errorf("created %v, want url %s", e, u)
		}
	}
}

// The request's shape and its events are checked before the key is claimed.
func TestWebhookEndpointRequestRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, tc := range []struct{ name, body, field, why string }{
		{"no events", `{"url":"` + publicHook + `"}`, "events", `["*"]`},
		{"empty events", endpointBody(publicHook), "events", `["*"]`},
		{"star and more", endpointBody(publicHook, "*", "charge.failed"), "events", "alone"},
		{"unknown type", endpointBody(publicHook, "charge.refunded"), "events", `"charge.refunded" is not an event type`},
		{"twice", endpointBody(publicHook, "charge.failed", "charge.failed"), "events", "twice"},
		{"events not a list", `{"url":"` + publicHook + `","events":"*"}`, "events", ""},
		{"events null", `{"url":"` + publicHook + `","events":null}`, "events", "null"},
		{"unknown field", `{"url":"` + publicHook + `","events":["*"],"secret":"whsec_mine"}`, "secret", "unknown field"},
		{"url not a string", `{"url":1,"events":["*"]}`, "url", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uuid.NewString()
			r := f.post("/v1/webhook_endpoints", key, tc.body)
			p := r.json(t)
			if r.status != http.StatusBadRequest || r.code(t) != "invalid-request" || p["field"] != tc.field {
				t.Fatalf("%d %s, want 400 invalid-request on field %s", r.status, r.body, tc.field)
			}
			if detail, _ := p["detail"].(string); !strings.Contains(detail, tc.why) {
				t.Errorf("detail %q does not say %q", detail, tc.why)
			}
			if n := f.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`, key); n != 0 {
				t.Errorf("the refused request's key was stored")
			}
		})
	}
	if r := f.post("/v1/webhook_endpoints", "", endpointBody(publicHook, "*")); r.status != http.StatusBadRequest || r.code(t) != "idempotency-key-missing" {
		t.Errorf("without a key: %d %s", r.status, r.body)
	}
	if n := f.endpoints(); n != 0 {
		t.Errorf("%d endpoints stored, want none", n)
	}
}

// A merchant has at most 16 live endpoints: the 17th is 409, stored under
// its key like any refusal; a deleted endpoint makes room again.
func TestWebhookEndpointLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var first string
	for i := range 16 {
		e := f.createEndpoint(endpointBody(fmt.Sprintf("%s/%d", publicHook, i), "*"))
		if i == 0 {
			first = e["id"].(string)
		}
	}
	key, body := uuid.NewString(), endpointBody(publicHook+"/17", "*")
	r := f.post("/v1/webhook_endpoints", key, body)
	if r.status != http.StatusConflict || r.code(t) != "too-many-webhook-endpoints" {
		t.Fatalf("17th: %d %s, want 409 too-many-webhook-endpoints", r.status, r.body)
	}
	if status, stored := f.storedResponse(key); status != http.StatusConflict || !bytes.Equal(stored, r.body) {
		t.Errorf("stored under the key: %d %s, want the 409", status, stored)
	}
	if n := f.endpoints(); n != 16 {
		t.Errorf("%d endpoints stored, want 16", n)
	}
	if d := f.delete("/v1/webhook_endpoints/" + first); d.status != http.StatusOK {
		t.Fatalf("delete: %d %s", d.status, d.body)
	}
	// The refusal stays the key's answer; a new key finds the room.
	if again := f.post("/v1/webhook_endpoints", key, body); again.status != http.StatusConflict || !bytes.Equal(again.body, r.body) ||
		again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay of the 17th: %d %s", again.status, again.body)
	}
	f.createEndpoint(body)
	if list := f.get("/v1/webhook_endpoints"); len(list.json(t)["data"].([]any)) != 16 {
		t.Errorf("list after delete and create: %s, want 16", list.body)
	}
}

// Deleting answers what was deleted; the endpoint is then unknown to reads,
// lists and a second delete, and its row is kept, marked deleted.
func TestWebhookEndpointDelete(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.createEndpoint(endpointBody(publicHook, "*"))["id"].(string)
	d := f.delete("/v1/webhook_endpoints/" + id)
	if d.status != http.StatusOK || string(d.body) != `{"id":"`+id+`","object":"webhook_endpoint","deleted":true}`+"\n" {
		t.Fatalf("delete: %d %s", d.status, d.body)
	}
	for what, r := range map[string]reply{
		"get":          f.get("/v1/webhook_endpoints/" + id),
		"delete again": f.delete("/v1/webhook_endpoints/" + id),
		"malformed id": f.delete("/v1/webhook_endpoints/we_nope"),
		"unknown id":   f.get("/v1/webhook_endpoints/we_" + strings.ReplaceAll(uuid.NewString(), "-", "")),
	} {
		if r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Errorf("%s: %d %s, want 404 not-found", what, r.status, r.body)
		}
	}
	if list := f.get("/v1/webhook_endpoints"); string(list.body) != `{"object":"list","data":[],"has_more":false}`+"\n" {
		t.Errorf("list after delete: %s", list.body)
	}
	if n := f.count(`SELECT count(*) FROM webhook_endpoints WHERE merchant_id = $1 AND deleted_at IS NOT NULL`); n != 1 {
		t.Errorf("%d rows marked deleted, want 1", n)
	}
}

// Another merchant's endpoint is unknown: not listed, read or deleted.
func TestWebhookEndpointIsolation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	g := f.otherMerchant()
	id := f.createEndpoint(endpointBody(publicHook, "*"))["id"].(string)
	for what, r := range map[string]reply{
		"get":    g.get("/v1/webhook_endpoints/" + id),
		"delete": g.delete("/v1/webhook_endpoints/" + id),
	} {
		if r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Errorf("the other merchant's %s: %d %s, want 404", what, r.status, r.body)
		}
	}
	if list := g.get("/v1/webhook_endpoints"); len(list.json(t)["data"].([]any)) != 0 {
		t.Errorf("the other merchant lists %s", list.body)
	}
	if r := f.get("/v1/webhook_endpoints/" + id); r.status != http.StatusOK {
		t.Errorf("the owner's endpoint after the other's delete: %d %s", r.status, r.body)
	}
	if r := f.get("/v1/webhook_endpoints?limit=1"); r.status != http.StatusBadRequest || r.json(t)["field"] != "limit" {
		t.Errorf("list with a query parameter: %d %s, want 400 on field limit", r.status, r.body)
	}
}
