package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/webhook"
)

// receiver is a local webhook endpoint that answers 500 to its first
// `fail` deliveries and 200 after, recording each delivery's event id. Each
// delivery is checked against openapi.yaml's webhooks.event.
type receiver struct {
	url  string
	mu   sync.Mutex
	fail int
	got  []string // Payments-Event-Id of each delivery, in arrival order
}

func newReceiver(t *testing.T, fail int) *receiver {
	t.Helper()
	r := &receiver{fail: fail}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			t.Errorf("read a delivery: %v", err)
		}
		checkDelivery(t, req, body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got = append(r.got, req.Header.Get(webhook.EventIDHeader))
		if len(r.got) <= r.fail {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/hook"
	return r
}

// wait waits until the receiver has had n deliveries, and returns them.
func (r *receiver) wait(t *testing.T, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		got := append([]string(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
	}
	t.Fatalf("the receiver got fewer than %d deliveries in 10 s", n)
	return nil
}

// deliver runs a Deliverer on the fixture's store until the test ends,
// retrying at once after a failure. The fixture must have a database of
// its own, so that no other test's endpoints are delivered to.
func (f *fixture) deliver() {
	f.t.Helper()
	d := webhook.NewDeliverer(f.store, slog.New(slog.DiscardHandler), webhook.Options{
		AllowPrivate: true, Poll: 10 * time.Millisecond, Backoff: func(int) time.Duration { return 0 },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	f.t.Cleanup(func() {
		cancel()
		<-done
	})
}

type attemptPage struct {
	Object string `json:"object"`
	Data   []struct {
		ID         string  `json:"id"`
		Object     string  `json:"object"`
		EndpointID string  `json:"endpoint_id"`
		EventID    string  `json:"event_id"`
		At         string  `json:"attempted_at"`
		Status     *int    `json:"status"`
		Error      *string `json:"error"`
		LatencyMS  *int    `json:"latency_ms"`
	} `json:"data"`
	HasMore bool `json:"has_more"`
}

func (f *fixture) attempts(path string) attemptPage {
	f.t.Helper()
	r := f.get(path)
	var p attemptPage
	if err := json.Unmarshal(r.body, &p); r.status != http.StatusOK || err != nil {
		f.t.Fatalf("GET %s: %d %s (%v)", path, r.status, r.body, err)
	}
	return p
}

// TestWebhookAttemptsAndResend: a delivery answered 500 then 200 leaves two
// attempts, listed newest first and paged by cursor; a resend sends the same
// event again, and its attempt joins the list; a replay of the resend
// schedules nothing more.
func TestWebhookAttemptsAndResend(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.allowPrivate, o.databaseURL = true, pgtest.NewDatabase(t) })
	rcv := newReceiver(t, 1)
	endpoint := f.createEndpoint(endpointBody(rcv.url, "account.created"))["id"].(string)
	f.account("USD", 0)
	var event string
	if err := f.db.QueryRow(t.Context(), `SELECT 'evt_' || replace(id::text, '-', '') FROM events WHERE merchant_id = $1 AND type = 'account.created'`,
		f.merchantID).Scan(&event); err != nil {
		t.Fatal(err)
	}
	f.deliver()
	if got := rcv.wait(t, 2); got[0] != event || got[1] != event {
		t.Fatalf("deliveries %v, want %s twice", got, event)
	}
	base := "/v1/webhook_endpoints/" + endpoint + "/attempts"
	var all attemptPage
	for deadline := time.Now().Add(5 * time.Second); len(all.Data) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		all = f.attempts(base) // the 200's attempt is recorded just after it is answered
	}
	if all.Object != "list" || all.HasMore || len(all.Data) != 2 {
		t.Fatalf("attempts %+v, want 2", all)
	}
	newest, oldest := all.Data[0], all.Data[1]
	for _, a := range all.Data {
		if a.Object != "webhook_attempt" || a.EndpointID != endpoint || a.EventID != event || a.Error != nil || a.LatencyMS == nil || *a.LatencyMS < 0 {
			t.Errorf("attempt %+v", a)
		}
	}
	if newest.Status == nil || *newest.Status != 200 || oldest.Status == nil || *oldest.Status != 500 || newest.At < oldest.At {
		t.Errorf("attempts newest first %+v, want the 200 then the 500", all.Data)
	}

	first := f.attempts(base + "?limit=1")
	next := f.attempts(base + "?limit=1&starting_after=" + first.Data[0].ID)
	if len(first.Data) != 1 || !first.HasMore || first.Data[0].ID != newest.ID ||
		len(next.Data) != 1 || next.HasMore || next.Data[0].ID != oldest.ID {
		t.Errorf("pages %+v then %+v, want the two attempts one by one", first, next)
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?starting_after=" + event, "?starting_after=wha_0193", "?starting_after=" + payment.FormatID(payment.PrefixWebhookAttempt, uuid.New())} {
		if r := f.get(base + q); r.status != http.StatusBadRequest || r.code(t) != "invalid-request" {
			t.Errorf("attempts%s: %d %s, want 400", q, r.status, r.body)
		}
	}
	key := uuid.NewString()
	resend := "/v1/webhook_endpoints/" + endpoint + "/events/" + event + "/resend"
	r := f.post(resend, key, "")
	want := `{"object":"webhook_delivery","endpoint_id":"` + endpoint + `","event_id":"` + event + `","state":"pending"}`
	if r.status != http.StatusAccepted || string(bytes.TrimSpace(r.body)) != want {
		t.Fatalf("resend: %d %s, want 202 %s", r.status, r.body, want)
	}
	if got := rcv.wait(t, 3); got[2] != event {
		t.Errorf("the resend delivered %s, want %s", got[2], event)
	}
	again := f.post(resend, key, "")
	if again.status != http.StatusAccepted || !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replayed resend: %d %s", again.status, again.body)
	}
	for deadline := time.Now().Add(5 * time.Second); len(all.Data) < 3 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		all = f.attempts(base)
	}
	if len(all.Data) != 3 || all.Data[0].Status == nil || *all.Data[0].Status != 200 || all.Data[0].EventID != event {
		t.Errorf("attempts after the resend %+v, want a third, answered 200", all.Data)
	}
	time.Sleep(100 * time.Millisecond) // time enough for a wrongful second resend to arrive
	if got := rcv.wait(t, 3); len(got) != 3 {
		t.Errorf("deliveries %v after the replayed resend, want 3", got)
	}
}

// TestWebhookResendRefused: a resend or an attempts list of another
// merchant's endpoint, or of another merchant's event, is 404, as are an
// event the endpoint does not subscribe to and a deleted endpoint; a
// disabled endpoint's resend is 400. None schedules a delivery.
func TestWebhookResendRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	g := f.otherMerchant()
	mine := f.createEndpoint(endpointBody(publicHook, "account.created"))["id"].(string)
	theirs := g.createEndpoint(endpointBody(publicHook, "*"))["id"].(string)
	f.account("USD", 100) // account.created, and deposit.created, which mine does not subscribe to
	event := func(eventType string) string {
		var id string
		if err := f.db.QueryRow(t.Context(), `SELECT 'evt_' || replace(id::text, '-', '') FROM events WHERE merchant_id = $1 AND type = $2`,
			f.merchantID, eventType).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	created, deposited := event("account.created"), event("deposit.created")
	resend := func(who *fixture, endpoint, event string) reply {
		return who.post("/v1/webhook_endpoints/"+endpoint+"/events/"+event+"/resend", uuid.NewString(), "{}")
	}
	for name, r := range map[string]reply{
		"their endpoint, my event":        resend(g, theirs, created),
		"my endpoint, by them":            resend(g, mine, created),
		"an event not subscribed to":      resend(f, mine, deposited),
		"an unknown event":                resend(f, mine, payment.FormatID(payment.PrefixEvent, uuid.New())),
		"a malformed event id":            resend(f, mine, "evt_1"),
		"my endpoint's attempts, by them": g.get("/v1/webhook_endpoints/" + mine + "/attempts"),
	} {
		if r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Errorf("%s: %d %s, want 404", name, r.status, r.body)
		}
	}
	if _, err := f.db.Exec(t.Context(), `UPDATE webhook_endpoints SET status = 'disabled' WHERE merchant_id = $1`, f.merchantID); err != nil {
		t.Fatal(err)
	}
	if r := resend(f, mine, created); r.status != http.StatusBadRequest || r.json(t)["field"] != "webhook_endpoint_id" {
		t.Errorf("a disabled endpoint's resend: %d %s, want 400 on webhook_endpoint_id", r.status, r.body)
	}
	if r := f.delete("/v1/webhook_endpoints/" + mine); r.status != http.StatusOK {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := f.get("/v1/webhook_endpoints/" + mine + "/attempts"); r.status != http.StatusNotFound {
		t.Errorf("a deleted endpoint's attempts: %d %s, want 404", r.status, r.body)
	}
	if r := resend(f, mine, created); r.status != http.StatusNotFound {
		t.Errorf("a deleted endpoint's resend: %d %s, want 404", r.status, r.body)
	}
	if n := f.count(`SELECT count(*) FROM webhook_deliveries WHERE merchant_id = $1`); n != 0 {
		t.Errorf("%d deliveries scheduled, want none", n)
	}
}
