package webhook_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/webhook"
)

// receiver is a real HTTP server on a loopback port that counts the
// connections it accepted and the requests it answered.
type receiver struct {
	*httptest.Server
	conns, requests atomic.Int32
	lastBody        atomic.Value // string
}

func newReceiver(t *testing.T, h http.HandlerFunc) *receiver {
	t.Helper()
	r := &receiver{}
	r.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		body, _ := io.ReadAll(req.Body)
		r.lastBody.Store(string(body))
		h(w, req)
	}))
	r.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.conns.Add(1)
		}
	}
	r.Start()
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) port() string { return r.URL[strings.LastIndex(r.URL, ":")+1:] }

func ok(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }

func post(c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(`{"id":"evt_1"}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

// With allowPrivate off, the client does not even open a connection to a
// loopback address, given as an IP or as a name.
func TestClientRefusesLoopback(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, ok)
	c := webhook.NewClient(false, 0)
	for _, u := range []string{rcv.URL, "http://localhost:" + rcv.port() + "/hook"} {
		res, err := post(c, u)
		if err == nil {
			res.Body.Close()
		}
		if !errors.Is(err, webhook.ErrForbidden) || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("POST %s = %v, want a refusal wrapping ErrForbidden that names loopback", u, err)
		}
	}
	if n := rcv.conns.Load(); n != 0 {
		t.Errorf("the receiver accepted %d connections, want 0", n)
	}
}

// DNS rebinding: the name looked public when it was checked, and resolves
// to loopback when the delivery connects. The dialer checks the address it
// is about to use, so the delivery reaches nothing.
func TestClientRefusesRebinding(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, ok)
	u := "https://localhost:" + rcv.port() + "/hook"
	then := fakeDNS{"localhost": {"93.184.215.14"}}
	if err := webhook.CheckURL(context.Background(), u, then, false); err != nil {
		t.Fatalf("CheckURL when localhost looked public: %v", err)
	}
	res, err := post(webhook.NewClient(false, 0), u)
	if err == nil {
		res.Body.Close()
	}
	if !errors.Is(err, webhook.ErrForbidden) {
		t.Errorf("POST %s = %v, want ErrForbidden", u, err)
	}
	if n := rcv.conns.Load(); n != 0 {
		t.Errorf("the receiver accepted %d connections, want 0", n)
	}
}

// A URL that redirects to a local address: refused at creation, never
// connected to, and even where local addresses are allowed the redirect is
// the answer, not followed.
func TestClientRedirect(t *testing.T) {
	t.Parallel()
	target := newReceiver(t, ok)
	redirector := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/internal", http.StatusFound)
	})

	if err := webhook.CheckURL(context.Background(), redirector.URL, nil, false); !errors.Is(err, webhook.ErrForbidden) {
		t.Errorf("CheckURL(%s) = %v, want ErrForbidden", redirector.URL, err)
	}
	res, err := post(webhook.NewClient(false, 0), redirector.URL)
	if err == nil {
		res.Body.Close()
	}
	if !errors.Is(err, webhook.ErrForbidden) {
		t.Errorf("POST %s with allowPrivate off = %v, want ErrForbidden", redirector.URL, err)
	}
	if n := redirector.conns.Load(); n != 0 {
		t.Errorf("with allowPrivate off the redirector accepted %d connections, want 0", n)
	}

	res, err = post(webhook.NewClient(true, 0), redirector.URL)
	if err != nil {
		t.Fatalf("POST %s with allowPrivate on: %v", redirector.URL, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusFound || res.Header.Get("Location") != target.URL+"/internal" {
		t.Errorf("answer %d Location %q, want the redirect itself (302 to %s/internal)", res.StatusCode, res.Header.Get("Location"), target.URL)
	}
	if n := redirector.requests.Load(); n != 1 {
		t.Errorf("the redirector answered %d requests, want 1", n)
	}
	if n := target.conns.Load(); n != 0 {
		t.Errorf("the redirect's target accepted %d connections, want 0", n)
	}
}

// allowPrivate (development and tests) lets http://127.0.0.1:<port> through,
// at creation and at delivery.
func TestClientAllowPrivate(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, ok)
	if err := webhook.CheckURL(context.Background(), rcv.URL+"/hook", nil, true); err != nil {
		t.Fatalf("CheckURL(%s, allowPrivate) = %v, want nil", rcv.URL, err)
	}
	res, err := post(webhook.NewClient(true, 0), rcv.URL+"/hook")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Errorf("status %d, want 204", res.StatusCode)
	}
	if got, _ := rcv.lastBody.Load().(string); rcv.requests.Load() != 1 || got != `{"id":"evt_1"}` {
		t.Errorf("the receiver got %d requests, last body %q; want 1, the event", rcv.requests.Load(), got)
	}
}

// A receiver that hangs fails the attempt when the timeout ends.
func TestClientTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	rcv := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for handlers

	res, err := post(webhook.NewClient(true, 200*time.Millisecond), rcv.URL)
	if err == nil {
		res.Body.Close()
	}
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("POST to a hanging receiver = %v, want a timeout", err)
	}
}

// The defaults: 10 s, and no proxy from the environment (which would
// connect wherever it likes, past the dialer's check).
func TestNewClientDefaults(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		c := webhook.NewClient(allow, 0)
		if c.Timeout != 10*time.Second {
			t.Errorf("NewClient(%v, 0).Timeout = %s, want 10s", allow, c.Timeout)
		}
		tr, isTransport := c.Transport.(*http.Transport)
		if !isTransport || tr.Proxy != nil {
			t.Errorf("NewClient(%v, 0) transport %T, want an *http.Transport without Proxy", allow, c.Transport)
		}
	}
}
