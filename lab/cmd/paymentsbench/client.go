package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	payments "github.com/exactlyonce/payments/client"
)

// client speaks the payments API as one merchant.
type client struct {
	baseURL string
	auth    string // the Authorization header
	http    *http.Client
	// api sends the setup requests (accounts, deposits, balances) through the
	// payments client and its retry policy; the measured charges go through
	// do, one request per call, so that every attempt is counted and timed.
	api *payments.Client
}

// newClient returns a client whose connection pool keeps an idle connection for
// every concurrent client, so the run measures requests, not TCP handshakes.
func newClient(baseURL, apiKey string, clients int, timeout time.Duration) *client {
	tr := &http.Transport{
		Proxy:               nil, // traffic goes straight to the service under test
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2 * clients,
		MaxIdleConnsPerHost: 2 * clients,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	hc := &http.Client{Transport: tr, Timeout: timeout}
	return &client{
		baseURL: strings.TrimRight(baseURL, "/"),
		auth:    "Bearer " + apiKey,
		http:    hc,
		api:     payments.New(baseURL, apiKey, payments.WithHTTPClient(hc), payments.WithRetryPolicy(setupRetryPolicy)),
	}
}

// setupRetryPolicy is how the setup requests retry: five attempts, as the
// charges completed before a replay run do (see retry).
var setupRetryPolicy = payments.RetryPolicy{MaxAttempts: 5, BaseDelay: 200 * time.Millisecond}

// answer is what the service said to one request.
type answer struct {
	status   int
	replayed bool   // Idempotent-Replayed: true
	location string // the Location header of a 201
}

// final reports whether the answer is a key's stored outcome, which every retry
// with that key replays. Anything else (409 in use, 5xx, no answer) leaves the
// key unsettled: a retry may still execute it.
func (a answer) final() bool {
	switch a.status {
	case http.StatusCreated, http.StatusPaymentRequired, http.StatusNotFound, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// chargeRequest is one charge as sent: of an account, or of a payment method
// at the card processor when paymentMethod is set. A key always goes with the
// same body, so a retry is the exact same request.
type chargeRequest struct {
	key           string
	account       string
	paymentMethod string
	amount        int64
}

func (r chargeRequest) body() []byte {
	b := make([]byte, 0, 80)
	if r.paymentMethod != "" {
		b = append(b, `{"payment_method":"`...)
		b = append(b, r.paymentMethod...)
	} else {
		b = append(b, `{"account_id":"`...)
		b = append(b, r.account...)
	}
	b = append(b, `","amount":`...)
	b = strconv.AppendInt(b, r.amount, 10)
	return append(b, `,"currency":"USD"}`...)
}

// charge sends POST /v1/charges. The error is a transport failure; any HTTP
// status is an answer.
func (c *client) charge(ctx context.Context, r chargeRequest) (answer, error) {
	return c.do(ctx, http.MethodPost, "/v1/charges", r.key, r.body())
}

// createAccount opens a USD account and returns its id. The API client
// retries what may be retried (no answer, 409 in use, 429, 5xx) with key.
func (c *client) createAccount(ctx context.Context, key string) (string, error) {
	res, err := c.api.CreateAccount(ctx, payments.NewAccount{Currency: "USD"}, payments.WithIdempotencyKey(key))
	if err != nil {
		return "", err
	}
	if res.Data.ID == "" {
		return "", fmt.Errorf("POST /v1/accounts: no account id in the answer")
	}
	return res.Data.ID, nil
}

// deposit funds account with amount, retried as createAccount is.
func (c *client) deposit(ctx context.Context, account, key string, amount int64) error {
	_, err := c.api.Deposit(ctx, account, payments.NewDeposit{Amount: amount}, payments.WithIdempotencyKey(key))
	return err
}

// balance reads the account's current balance, retried as createAccount is.
func (c *client) balance(ctx context.Context, account string) (int64, error) {
	res, err := c.api.GetAccount(ctx, account)
	if err != nil {
		return 0, err
	}
	return res.Data.Balance, nil
}

// statusError is an answer other than the one a setup request expects.
type statusError struct {
	request string
	answer  answer
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s: %d", e.request, e.answer.status)
}

// temporary reports whether the same request may succeed later: the key was
// still in use, or the service failed and rolled back.
func (e *statusError) temporary() bool {
	return e.answer.status == http.StatusConflict || e.answer.status >= 500
}

// waitReady polls GET /readyz until it answers 200 or timeout passes.
func (c *client) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		a, err := c.do(ctx, http.MethodGet, "/readyz", "", nil)
		if err == nil && a.status == http.StatusOK {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("status %d", a.status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("service at %s not ready after %s: %w", c.baseURL, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// do sends one request; key, when set, is the Idempotency-Key. The body of the
// answer is read to the end and dropped, so the connection goes back to the pool.
func (c *client) do(ctx context.Context, method, path, key string, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", c.auth)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{
		status:   resp.StatusCode,
		replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		location: resp.Header.Get("Location"),
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return answer{}, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return a, nil
}
