package stripeproc_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/processor/stripeproc"
	"github.com/exactlyonce/payments/internal/testkit/stripemocktest"
)

// recorder records every request the connector sends and the status it was
// answered with.
type recorder struct {
	mu    sync.Mutex
	calls []string
	next  http.RoundTripper
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	status := "error"
	if err == nil {
		status = resp.Status
	}
	r.mu.Lock()
	r.calls = append(r.calls, req.Method+" "+req.URL.Path+" "+status)
	r.mu.Unlock()
	return resp, err
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

// TestConnectorRequestsAreValidStripeRequests sends every request the
// connector makes to stripe-mock, which refuses (400) any request that does
// not match Stripe's OpenAPI description, and checks that each was accepted
// (200) and its answer parsed.
func TestConnectorRequestsAreValidStripeRequests(t *testing.T) {
	base := stripemocktest.Start(t)
	rec := &recorder{next: http.DefaultTransport}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := stripeproc.New(ctx, stripeproc.Config{APIKey: "sk_test_123", APIBase: base,
		HTTPClient: &http.Client{Transport: rec}, MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	if name := s.Name(); !strings.HasPrefix(name, "stripe acct_") {
		t.Errorf("Name() = %q, want stripe and the account the key is", name)
	}
	want := []string{"GET /v1/account 200 OK"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("asking for the account: %q, want %q", got, want)
	}

	// stripe-mock keeps no state: it answers each request with a fixture
	// (a payment intent requiring a payment method), so what is checked is
	// that Stripe's validator accepts the request and the answer parses.
	parsed := func(call string, r processor.Result) {
		t.Helper()
		if r.Err != nil || r.Outcome == processor.Unknown || r.Payment.PSPReference == "" {
			t.Errorf("%s: %+v, want an answer parsed, with a payment intent", call, r)
		}
	}
	for _, capture := range []bool{true, false} {
		parsed("authorize", s.Authorize(ctx, processor.Authorization{Key: "ch_0001:authorize", Reference: "ch_0001",
			Amount: 1000, Currency: "USD", PaymentMethod: "pm_card_visa", Capture: capture}))
	}
	parsed("capture", s.Capture(ctx, "ch_0001:capture", "pi_123", 400))
	parsed("capture all", s.Capture(ctx, "ch_0001:capture", "pi_123", 0))
	parsed("void", s.Void(ctx, "ch_0001:void", "pi_123"))
	if r := s.Refund(ctx, "ch_0001:refund", "pi_123", 300); r.Err != nil || r.Outcome == processor.Unknown {
		t.Errorf("refund: %+v, want an answer parsed", r)
	}
	found, err := s.Lookup(ctx, "ch_0001")
	if err != nil || len(found) == 0 || found[0].PSPReference == "" {
		t.Errorf("lookup: %+v, %v; want the fixture's intents parsed", found, err)
	}
	listed, err := s.Payments(ctx, time.Now().Add(-time.Hour), time.Now())
	if err != nil || len(listed) == 0 || listed[0].PSPReference == "" || listed[0].Created.IsZero() {
		t.Errorf("payments: %+v, %v; want the fixture's intents parsed, with when they were created", listed, err)
	}
	want = []string{
		"POST /v1/payment_intents 200 OK",
		"POST /v1/payment_intents 200 OK",
		"POST /v1/payment_intents/pi_123/capture 200 OK",
		"POST /v1/payment_intents/pi_123/capture 200 OK",
		"POST /v1/payment_intents/pi_123/cancel 200 OK",
		"POST /v1/refunds 200 OK",
		"GET /v1/payment_intents/search 200 OK",
		"GET /v1/payment_intents 200 OK",
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A reversal looks the reference up and gives back what each intent
	// holds: the fixture requires a payment method, so it is cancelled.
	r := s.Reverse(ctx, "ch_0001:reverse-1", "ch_0001")
	if r.Err != nil || len(r.Payments) == 0 {
		t.Errorf("reverse: %+v, want the intents found and cancelled", r)
	}
	want = []string{"GET /v1/payment_intents/search 200 OK", "POST /v1/payment_intents/" + r.Payments[0].PSPReference + "/cancel 200 OK"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Errorf("reverse's requests: %q, want %q", got, want)
	}
}

// TestConnectorStartsWithItsAccountNamed checks that a named account is not
// asked for.
func TestConnectorStartsWithItsAccountNamed(t *testing.T) {
	rec := &recorder{next: http.DefaultTransport}
	s, err := stripeproc.New(context.Background(), stripeproc.Config{APIKey: "sk_test_123", APIBase: "http://127.0.0.1:1",
		Account: "acct_42", HTTPClient: &http.Client{Transport: rec}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "stripe acct_42" || len(rec.take()) != 0 {
		t.Errorf("Name() = %q, want stripe acct_42 with no request", s.Name())
	}
	if _, err := stripeproc.New(context.Background(), stripeproc.Config{APIKey: "sk_test_123", APIBase: "http://127.0.0.1:1"}); err == nil ||
		!strings.Contains(err.Error(), "STRIPE_ACCOUNT") || strings.Contains(err.Error(), "sk_test_123") {
		t.Errorf("unreachable Stripe, no account named: %v, want an error naming STRIPE_ACCOUNT, never the key", err)
	}
}
