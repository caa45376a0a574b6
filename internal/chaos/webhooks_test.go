package chaos_test

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	paymentsclient "github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/webhook"
)

// hookReceiver is a merchant's web server on a local port: it records every
// delivery request it gets, by path (each path an endpoint), before it
// answers, so a request cut short by a kill is recorded too. It may hold a
// request a while (hold) and answers status (204 while 0).
type hookReceiver struct {
	hold     func() time.Duration // nil: answers at once
	status   atomic.Int64
	inFlight atomic.Int64 // requests being held or answered now

	mu  sync.Mutex
	got map[string][]hookRequest
}

// hookRequest is one delivery request as the receiver got it.
type hookRequest struct {
	eventID, signature string
	body               []byte
	status             int       // what the receiver answered (or began to)
	at                 time.Time // when it arrived
}

func (r *hookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	at := time.Now()
	body, _ := io.ReadAll(req.Body)
	status := int(r.status.Load())
	if status == 0 {
		status = http.StatusNoContent
	}
	r.mu.Lock()
	if r.got == nil {
		r.got = map[string][]hookRequest{}
	}
	r.got[req.URL.Path] = append(r.got[req.URL.Path], hookRequest{
		eventID: req.Header.Get(webhook.EventIDHeader), signature: req.Header.Get(webhook.SignatureHeader), body: body, status: status, at: at,
	})
	r.mu.Unlock()
	if r.hold != nil {
		if d := r.hold(); d > 0 {
			select {
			case <-time.After(d):
			case <-req.Context().Done():
			}
		}
	}
	w.WriteHeader(status)
}

// requests is what the endpoint at path got so far.
func (r *hookReceiver) requests(path string) []hookRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]hookRequest(nil), r.got[path]...)
}

// listen serves r on addr ("127.0.0.1:0" for any port) until the returned
// server is closed, or the test ends.
func (r *hookReceiver) listen(t *testing.T, addr string) *httptest.Server {
	t.Helper()
	return serveOn(t, addr, r)
}

// serveOn serves h on addr ("127.0.0.1:0" for any port) until the returned
// server is closed, or the test ends.
func serveOn(t *testing.T, addr string, h http.Handler) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	must(t, err, "listen on %s", addr)
	srv := httptest.NewUnstartedServer(h)
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// threeEndpoints starts a hookReceiver on a local port with the endpoints of
// the webhook scenarios on it: m's /all (every event) and /charges
// (charge.succeeded), made with c, and other's /other (every event), made with
// oc. One request in eight is held 300 ms to 1 s, so that a fault finds one
// in flight; the others are answered at once, so each endpoint has few in
// flight at a fault, and the rest of its 4 slots deliver on while the cut
// ones wait for their lease to end.
func threeEndpoints(t *testing.T, ctx context.Context, c *client, m merchant, oc *client, other merchant) (*hookReceiver, []hookEndpoint) {
	t.Helper()
	recv := &hookReceiver{hold: func() time.Duration {
		if rand.IntN(8) > 0 {
			return 0
		}
		return 300*time.Millisecond + rand.N(700*time.Millisecond)
	}}
	base := recv.listen(t, "127.0.0.1:0").URL
	return recv, []hookEndpoint{
		mustEndpoint(t, ctx, c, m, recv, base, "/all", "*"),
		mustEndpoint(t, ctx, c, m, recv, base, "/charges", "charge.succeeded"),
		mustEndpoint(t, ctx, oc, other, recv, base, "/other", "*"),
	}
}

// hookEndpoint is a webhook endpoint the scenario created, with what it
// needs to judge the endpoint's deliveries.
type hookEndpoint struct {
	id, secret string
	merchantID string
	events     []string // ["*"] or the types it subscribes to
	path       string   // on recv
	recv       *hookReceiver
}

// mustEndpoint creates a webhook endpoint of c's merchant (m) at base+path
// on recv, subscribed to events.
func mustEndpoint(t *testing.T, ctx context.Context, c *client, m merchant, recv *hookReceiver, base, path string, events ...string) hookEndpoint {
	t.Helper()
	we := mustCreate(t, c, "POST /v1/webhook_endpoints", func(api *paymentsclient.Client, key paymentsclient.CallOption) (*paymentsclient.Result[paymentsclient.WebhookEndpoint], error) {
		return api.CreateWebhookEndpoint(ctx, paymentsclient.NewWebhookEndpoint{URL: base + path, Events: events}, key)
	})
	if we.Secret == nil {
		t.Fatal("POST /v1/webhook_endpoints answered no secret")
	}
	return hookEndpoint{id: we.ID, secret: *we.Secret, merchantID: m.ID, events: events, path: path, recv: recv}
}

// deliveriesInFlight is the Deliverer's bound on attempts in flight, in all
// (webhook.Options.InFlight's default, which serve keeps).
const deliveriesInFlight = 32

// awaitDeliveries waits up to bound until the fan-out has made a delivery
// for every event every live endpoint subscribes to and none is pending any
// more, and reports whether that came. A delivery whose process was killed
// waits for its lease (15 s) to end; a failed one for its backoff.
func awaitDeliveries(t *testing.T, ctx context.Context, db *pgxpool.Pool, bound time.Duration) bool {
	t.Helper()
	const q = `SELECT
	    (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
	    (SELECT count(*) FROM webhook_deliveries),
	    (SELECT count(*) FROM events e JOIN webhook_endpoints w ON w.merchant_id = e.merchant_id
	       AND ('*' = ANY (w.events) OR e.type = ANY (w.events)) WHERE w.deleted_at IS NULL)`
	deadline := time.Now().Add(bound)
	for {
		var pending, made, want int
		must(t, db.QueryRow(ctx, q).Scan(&pending, &made, &want), "count deliveries")
		if pending == 0 && made == want {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("after %v: %d deliveries pending, %d made of the %d the events call for", bound, pending, made, want)
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hookVerdict is what judgeHooks found over all endpoints.
type hookVerdict struct {
	events     int // deliveries the endpoints' subscriptions called for
	received   int // requests the receivers got
	lost       int // events an endpoint subscribes to that never reached it
	duplicates int // requests answered 2xx beyond one per event and endpoint (at least once allows them)
	foreign    int // requests of events not the endpoint's merchant's or not subscribed to
	ghosts     int // requests of events the database does not have (one a failover lost, say)
	badSigs    int // requests the client's VerifyWebhook refused, or whose body is another event
	failures   int // attempts recorded with an error or a status other than 2xx
	unrecorded int // requests received with no attempt recorded: cut by a kill
	phantoms   int // attempts recorded that reached no receiver, or deliveries marked delivered without a 2xx attempt
	notDone    int // deliveries still pending or abandoned
}

// violations counts the broken invariants (lost deliveries apart).
func (v hookVerdict) violations() int {
	return v.foreign + v.ghosts + v.badSigs + v.phantoms + v.notDone
}

// judgeHooks holds each endpoint's receiver against the database: every
// event of its merchant it subscribes to reached it and was answered 2xx at
// least once, signed with its secret (the Go client's VerifyWebhook), and
// nothing else did (not even an event the database does not have); every
// attempt recorded with an HTTP status was received, and every delivery marked
// delivered has a recorded 2xx attempt. It fails t for each problem.
func judgeHooks(t *testing.T, ctx context.Context, db *pgxpool.Pool, endpoints []hookEndpoint) hookVerdict {
	t.Helper()
	var v hookVerdict
	for _, e := range endpoints {
		want := subscribedEvents(t, ctx, db, e)
		v.events += len(want)
		got, acked := map[string]int{}, map[string]int{}
		for _, r := range e.recv.requests(e.path) {
			v.received++
			got[r.eventID]++
			if r.status >= 200 && r.status < 300 {
				acked[r.eventID]++
			}
			var body struct{ ID string }
			if err := paymentsclient.VerifyWebhook(r.body, r.signature, e.secret, 10*time.Minute); err != nil ||
				json.Unmarshal(r.body, &body) != nil || body.ID != r.eventID {
				v.badSigs++
				t.Errorf("endpoint %s: delivery of %s (body id %q) does not verify: %v", e.path, r.eventID, body.ID, err)
			}
		}
		for _, n := range acked {
			v.duplicates += n - 1
		}
		for id := range got {
			switch {
			case want[id]:
			case !eventExists(t, ctx, db, id):
				v.ghosts++
				t.Errorf("endpoint %s received %s, an event the database does not have", e.path, id)
			default:
				v.foreign++
				t.Errorf("endpoint %s (events %v) received %s, not one of its merchant's events it subscribes to", e.path, e.events, id)
			}
		}
		for id := range want {
			if acked[id] == 0 {
				v.lost++
				t.Errorf("endpoint %s (events %v) never received %s", e.path, e.events, id)
			}
		}
		// Per event: requests received against attempts recorded with a status.
		for id, answered := range recordedAttempts(t, ctx, db, e, &v.failures) {
			switch n := got[id]; {
			case n < answered:
				v.phantoms += answered - n
				t.Errorf("endpoint %s: %d attempts of %s recorded with a status, %d received", e.path, answered, id, n)
			default:
				v.unrecorded += n - answered
			}
			delete(got, id)
		}
		for _, n := range got {
			v.unrecorded += n
		}
	}
	const q = `SELECT
	    count(*) FILTER (WHERE state = 'delivered' AND NOT EXISTS (SELECT 1 FROM webhook_attempts a
	        WHERE a.merchant_id = d.merchant_id AND a.endpoint_id = d.endpoint_id AND a.event_id = d.event_id
	          AND a.status BETWEEN 200 AND 299)),
	    count(*) FILTER (WHERE state <> 'delivered')
	  FROM webhook_deliveries d`
	var unfounded, notDone int
	must(t, db.QueryRow(ctx, q).Scan(&unfounded, &notDone), "audit deliveries")
	if unfounded > 0 || notDone > 0 {
		t.Errorf("%d deliveries marked delivered without a 2xx attempt recorded; %d not delivered", unfounded, notDone)
	}
	v.phantoms += unfounded
	v.notDone = notDone
	return v
}

// subscribedEvents is the set of e's merchant's events of the types e
// subscribes to, by public id.
func subscribedEvents(t *testing.T, ctx context.Context, db *pgxpool.Pool, e hookEndpoint) map[string]bool {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT 'evt_' || replace(id::text, '-', '') FROM events
	    WHERE merchant_id = $1 AND ('*' = ANY ($2::text[]) OR type = ANY ($2::text[]))`, e.merchantID, e.events)
	must(t, err, "read events")
	defer rows.Close()
	want := map[string]bool{}
	for rows.Next() {
		var id string
		must(t, rows.Scan(&id), "scan event")
		want[id] = true
	}
	must(t, rows.Err(), "read events")
	return want
}

// eventExists reports whether the database has the event of public id id.
func eventExists(t *testing.T, ctx context.Context, db *pgxpool.Pool, id string) bool {
	t.Helper()
	uid, err := uuid.Parse(strings.TrimPrefix(id, "evt_"))
	if err != nil {
		return false // a request with no event id, or a made-up one
	}
	var exists bool
	must(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)`, uid).Scan(&exists), "look for event %s", id)
	return exists
}

// recordedAttempts returns, per event, how many of e's recorded attempts
// have an HTTP status (those reached the receiver), and adds the failed
// attempts (an error, or a status other than 2xx) to failures.
func recordedAttempts(t *testing.T, ctx context.Context, db *pgxpool.Pool, e hookEndpoint, failures *int) map[string]int {
	t.Helper()
	id, err := uuid.Parse(strings.TrimPrefix(e.id, "we_"))
	must(t, err, "endpoint id %q", e.id)
	rows, err := db.Query(ctx, `SELECT 'evt_' || replace(event_id::text, '-', ''),
	        count(status), count(*) FILTER (WHERE error IS NOT NULL OR status NOT BETWEEN 200 AND 299)
	    FROM webhook_attempts WHERE merchant_id = $1 AND endpoint_id = $2 GROUP BY event_id`, e.merchantID, id)
	must(t, err, "read attempts")
	defer rows.Close()
	answered := map[string]int{}
	for rows.Next() {
		var (
			event      string
			withStatus int
			failedHere int
		)
		must(t, rows.Scan(&event, &withStatus, &failedHere), "scan attempts")
		answered[event] = withStatus
		*failures += failedHere
	}
	must(t, rows.Err(), "read attempts")
	return answered
}

// failedAttempts counts e's attempts recorded with an error and those with a
// status other than 2xx.
func failedAttempts(t *testing.T, ctx context.Context, db *pgxpool.Pool, e hookEndpoint) (errored, refused int) {
	t.Helper()
	id, err := uuid.Parse(strings.TrimPrefix(e.id, "we_"))
	must(t, err, "endpoint id %q", e.id)
	must(t, db.QueryRow(ctx, `SELECT count(error), count(*) FILTER (WHERE status NOT BETWEEN 200 AND 299)
	    FROM webhook_attempts WHERE merchant_id = $1 AND endpoint_id = $2`, e.merchantID, id).Scan(&errored, &refused),
		"count failed attempts")
	return errored, refused
}
