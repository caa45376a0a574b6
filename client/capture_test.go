package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// seen is one request as the fake service below received it.
type seen struct {
	path, key, body string
}

// answer is what the fake service sends back: a status and a JSON body.
type answer struct {
	status int
	body   string
}

// fakeService answers each request with the next of answers, and the last
// one for every request after, and records what it received.
func fakeService(t *testing.T, answers ...answer) (*Client, func() []seen) {
	t.Helper()
	var (
		mu   sync.Mutex
		got  []seen
		next int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{path: r.URL.Path, key: r.Header.Get("Idempotency-Key"), body: string(body)})
		a := answers[min(next, len(answers)-1)]
		next++
		mu.Unlock()
		if a.status == http.StatusOK {
			w.Header().Set("Content-Type", "application/json")
		} else {
			w.Header().Set("Content-Type", "application/problem+json")
		}
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(srv.Close)
	c := New(srv.URL, "sk_test", WithRetryPolicy(RetryPolicy{MaxAttempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}))
	return c, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

const (
	unavailableBody = `{"type":"/problems/service-unavailable","title":"Service unavailable","status":503,"detail":"down","code":"service-unavailable"}`
	capturedBody    = `{"id":"ch_5b1e0c2a9f8d4e3b7a6c1d2e3f4a5b6c","object":"charge","status":"succeeded","amount":300,"amount_captured":250}`
	voidedBody      = `{"id":"ch_5b1e0c2a9f8d4e3b7a6c1d2e3f4a5b6c","object":"charge","status":"voided","amount":300,"amount_captured":0}`
)

// Capture and Void are POSTs like CreateRefund: one key for the operation,
// sent with the same body on every retry, to the charge's own path.
func TestCaptureAndVoidRetryWithOneKey(t *testing.T) {
	const id = "ch_5b1e0c2a9f8d4e3b7a6c1d2e3f4a5b6c"
	amount := int64(250)
	for _, tc := range []struct {
		name     string
		call     func(*Client) (*Result[Charge], error)
		reply    string
		path     string
		body     string
		status   ChargeStatus
		captured int64
	}{
		{"capture part", func(c *Client) (*Result[Charge], error) {
			return c.Capture(context.Background(), id, CaptureCharge{Amount: &amount})
		}, capturedBody, "/v1/charges/" + id + "/capture", `{"amount":250}`, ChargeStatusSucceeded, 250},
		{"capture whole", func(c *Client) (*Result[Charge], error) {
			return c.Capture(context.Background(), id, CaptureCharge{})
		}, capturedBody, "/v1/charges/" + id + "/capture", `{}`, ChargeStatusSucceeded, 250},
		{"void", func(c *Client) (*Result[Charge], error) {
			return c.Void(context.Background(), id)
		}, voidedBody, "/v1/charges/" + id + "/void", `{}`, ChargeStatusVoided, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, got := fakeService(t, answer{http.StatusServiceUnavailable, unavailableBody}, answer{http.StatusServiceUnavailable, unavailableBody},
				answer{http.StatusOK, tc.reply})
			res, err := tc.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if res.Data.Status != tc.status || res.Data.AmountCaptured != tc.captured || res.Attempts != 3 {
				t.Errorf("charge %+v after %d attempts, want %s with %d captured after 3", res.Data, res.Attempts, tc.status, tc.captured)
			}
			reqs := got()
			if len(reqs) != 3 {
				t.Fatalf("%d requests, want 3", len(reqs))
			}
			for i, r := range reqs {
				if r.path != tc.path || r.body != tc.body || r.key != res.IdempotencyKey || r.key == "" {
					t.Errorf("attempt %d: %+v, want %s %s with key %q", i+1, r, tc.path, tc.body, res.IdempotencyKey)
				}
			}
		})
	}
}

// A refusal of a capture or a void is returned at once with the charge's
// status, not retried.
func TestNotCapturableCarriesTheStatus(t *testing.T) {
	c, got := fakeService(t, answer{http.StatusConflict, `{"type":"/problems/charge-not-capturable","title":"Charge not capturable","status":409,` +
		`"detail":"charge is expired","code":"charge-not-capturable","charge_status":"expired"}`})
	_, err := c.Capture(context.Background(), "ch_5b1e0c2a9f8d4e3b7a6c1d2e3f4a5b6c", CaptureCharge{})
	var p *Problem
	if !errors.As(err, &p) || p.Code != CodeChargeNotCapturable || p.ChargeStatus != string(ChargeStatusExpired) {
		t.Fatalf("err = %v (%+v), want charge-not-capturable with charge_status expired", err, p)
	}
	if n := len(got()); n != 1 {
		t.Errorf("%d requests, want 1: a refusal is final", n)
	}
}
