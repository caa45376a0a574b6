package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
	"github.com/exactlyonce/payments/internal/webhook"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// delivered is a request a receiver got.
type delivered struct {
	path, contentType, eventID, signature string
	userAgent                             string
	body                                  []byte
}

// hookReceiver is a real HTTP server on a loopback port that records every
// request and answers with answer(n), n counting its requests from 1.
type hookReceiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []delivered
}

func newHookReceiver(t testing.TB, answer func(n int) int) *hookReceiver {
	t.Helper()
	r := &hookReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, delivered{req.URL.Path, req.Header.Get("Content-Type"),
			req.Header.Get(webhook.EventIDHeader), req.Header.Get(webhook.SignatureHeader), req.Header.Get("User-Agent"), body})
		n := len(r.got)
		r.mu.Unlock()
		w.WriteHeader(answer(n))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *hookReceiver) requests() []delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func always(status int) func(int) int { return func(int) int { return status } }

// bundle is a test's store on a database of its own, and a merchant.
type bundle struct {
	store    *postgres.Store
	merchant uuid.UUID
}

func setup(t testing.TB) bundle {
	t.Helper()
	s, err := postgres.Open(context.Background(), pgtest.NewDatabase(t), postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return bundle{store: s, merchant: newMerchant(t, s)}
}

func newMerchant(t testing.TB, s *postgres.Store) uuid.UUID {
	t.Helper()
	id, _, err := s.RegisterMerchant(context.Background(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func endpoint(t testing.TB, s *postgres.Store, merchant uuid.UUID, url string, events ...string) payment.WebhookEndpoint {
	t.Helper()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.CreateWebhookEndpoint(context.Background(), merchant, url, events, secret)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// event writes an event of the merchant, without the money movement behind
// it, and returns its id as the API shows it.
func event(t *testing.T, s *postgres.Store, merchant uuid.UUID, eventType string) string {
	t.Helper()
	return payment.FormatID(payment.PrefixEvent, webhooktest.AddEvent(t, s.Pool(), merchant, eventType))
}

// start runs a Deliverer on s until the test ends: local receivers allowed,
// polling often, and every retry due at once.
func start(t testing.TB, s webhook.Store, opts webhook.Options) {
	t.Helper()
	opts.AllowPrivate = true
	opts.Poll = 10 * time.Millisecond
	if opts.Backoff == nil {
		opts.Backoff = func(int) time.Duration { return 0 }
	}
	d := webhook.NewDeliverer(s, slog.New(slog.DiscardHandler), opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// waitFor polls cond until it holds, failing the test after a generous
// bound (it is no speed goal: a hang would otherwise last the test's whole
// timeout).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// eventIDs returns the Payments-Event-Id of each request.
func eventIDs(ds []delivered) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.eventID
	}
	return ids
}

// TestDeliverySigned: each event reaches the endpoint (in no set order) as
// /v1/events shows it, with its id, as JSON, signed so that the Go client's VerifyWebhook
// accepts it with the endpoint's secret; each attempt is recorded.
func TestDeliverySigned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newHookReceiver(t, always(http.StatusNoContent))
	e := endpoint(t, b.store, b.merchant, rcv.URL+"/hook", payment.AllEvents)
	want := []string{event(t, b.store, b.merchant, payment.EventChargeSucceeded), event(t, b.store, b.merchant, payment.EventRefundCreated)}
	start(t, b.store, webhook.Options{})

	waitFor(t, "both events arrive", func() bool { return len(rcv.requests()) >= 2 })
	feed, err := b.store.Events(context.Background(), b.merchant, payment.EventQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := rcv.requests()
	// Concurrent, deliveries keep no order: compared as a set.
	ids := eventIDs(got)
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("delivered %v, want %v", ids, want)
	}
	bodies := map[string][]byte{}
	for _, e := range feed.Items {
		bodies[payment.FormatID(payment.PrefixEvent, e.ID)], _ = json.Marshal(e)
	}
	for i, d := range got {
		wantBody := bodies[d.eventID]
		if string(d.body) != string(wantBody) || d.contentType != "application/json" || d.path != "/hook" {
			t.Errorf("delivery %d: %s %q %s, want /hook application/json %s", i, d.path, d.contentType, d.body, wantBody)
		}
		if d.userAgent != webhook.UserAgent {
			t.Errorf("delivery %d: User-Agent %q, want %q (not Go's default)", i, d.userAgent, webhook.UserAgent)
		}
		if err := client.VerifyWebhook(d.body, d.signature, e.Secret, time.Minute); err != nil {
			t.Errorf("delivery %d: VerifyWebhook: %v", i, err)
		}
		if err := client.VerifyWebhook(d.body, d.signature, "whsec_another", time.Minute); err == nil {
			t.Errorf("delivery %d: verified with another secret", i)
		}
	}
	waitFor(t, "both attempts are recorded", func() bool { return len(webhooktest.Attempts(t, b.store.Pool(), e.ID)) == 2 })
	if a := webhooktest.Attempts(t, b.store.Pool(), e.ID); !slices.Equal(a, []webhooktest.Attempt{{Status: 204}, {Status: 204}}) {
		t.Errorf("attempts %v, want two 204s", a)
	}
}

// TestDeliveryRetried: a receiver answering 500 gets the event again, with
// the same event id and a signature of its own, and the record shows both
// attempts.
func TestDeliveryRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newHookReceiver(t, func(n int) int {
		if n == 1 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	e := endpoint(t, b.store, b.merchant, rcv.URL, payment.AllEvents)
	id := event(t, b.store, b.merchant, payment.EventChargeSucceeded)
	start(t, b.store, webhook.Options{})

	waitFor(t, "the attempts are recorded", func() bool { return len(webhooktest.Attempts(t, b.store.Pool(), e.ID)) >= 2 })
	got := rcv.requests()
	if ids := eventIDs(got); !slices.Equal(ids, []string{id, id}) {
		t.Fatalf("requests %v, want %s twice", ids, id)
	}
	for i, d := range got {
		if err := client.VerifyWebhook(d.body, d.signature, e.Secret, time.Minute); err != nil {
			t.Errorf("attempt %d: VerifyWebhook: %v", i+1, err)
		}
	}
	if a := webhooktest.Attempts(t, b.store.Pool(), e.ID); !slices.Equal(a, []webhooktest.Attempt{{Status: 500}, {Status: 200}}) {
		t.Errorf("attempts %v, want 500 then 200", a)
	}
}

// TestDeliveryIsolation: two merchants' endpoints on one receiver each get
// their own merchant's events only, and an endpoint subscribed to one type
// gets only that type.
func TestDeliveryIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	globex := newMerchant(t, b.store)
	rcv := newHookReceiver(t, always(http.StatusOK))
	endpoint(t, b.store, b.merchant, rcv.URL+"/acme", payment.AllEvents)
	endpoint(t, b.store, globex, rcv.URL+"/globex", payment.EventChargeFailed)
	want := map[string][]string{"/acme": nil, "/globex": nil}
	for _, typ := range []string{payment.EventChargeSucceeded, payment.EventChargeFailed, payment.EventRefundCreated} {
		want["/acme"] = append(want["/acme"], event(t, b.store, b.merchant, typ))
		id := event(t, b.store, globex, typ)
		if typ == payment.EventChargeFailed {
			want["/globex"] = append(want["/globex"], id)
		}
	}
	start(t, b.store, webhook.Options{})

	waitFor(t, "the four deliveries arrive", func() bool { return len(rcv.requests()) >= 4 })
	got := map[string][]string{"/acme": nil, "/globex": nil}
	for _, d := range rcv.requests() {
		got[d.path] = append(got[d.path], d.eventID)
	}
	for path := range want {
		slices.Sort(got[path])
		slices.Sort(want[path])
		if !slices.Equal(got[path], want[path]) {
			t.Errorf("%s got %v, want %v", path, got[path], want[path])
		}
	}
}

// TestDeadEndpointDelaysNoOther: an endpoint on a closed port and one that
// hangs hold only their own slots: a healthy endpoint of the same merchant
// gets all its events before the hanging one's first attempt has even
// timed out.
func TestDeadEndpointDelaysNoOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + closed.Addr().String()
	closed.Close()
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for handlers
	healthy := newHookReceiver(t, always(http.StatusOK))

	dead := endpoint(t, b.store, b.merchant, deadURL, payment.AllEvents)
	hung := endpoint(t, b.store, b.merchant, hanging.URL, payment.AllEvents)
	endpoint(t, b.store, b.merchant, healthy.URL, payment.AllEvents)
	const events = 20
	for range events {
		event(t, b.store, b.merchant, payment.EventChargeSucceeded)
	}
	start(t, b.store, webhook.Options{PerEndpoint: 2, InFlight: 6, Timeout: 5 * time.Second})

	waitFor(t, "the healthy endpoint has every event", func() bool { return len(healthy.requests()) >= events })
	if a := webhooktest.Attempts(t, b.store.Pool(), hung.ID); len(a) != 0 {
		t.Errorf("the hanging endpoint's attempts %v already ended: the test proves nothing", a)
	}
	waitFor(t, "the dead endpoint's failures are recorded", func() bool { return len(webhooktest.Attempts(t, b.store.Pool(), dead.ID)) > 0 })
	if a := webhooktest.Attempts(t, b.store.Pool(), dead.ID); a[0].Status != 0 || a[0].Error == "" {
		t.Errorf("the dead endpoint's attempts %v, want errors", a)
	}
}
