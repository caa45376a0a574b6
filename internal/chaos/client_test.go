package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	paymentsclient "github.com/exactlyonce/payments/client"
)

// client is a merchant's HTTP client that retries like a careful integrator:
// a request that failed or timed out is sent again with the same key and the
// same body until it gets a definite answer.
type client struct {
	http   *http.Client
	tr     http.RoundTripper // the pool under http's counting transport
	apiKey string
	// base picks the service a request goes to; it may change between
	// attempts (a replica, a restarted process).
	base func(attempt int) string
	// keyPrefix starts every idempotency key the client makes, so a test can
	// look for any of them in the service's logs at once.
	keyPrefix string
	stats     *clientStats
}

// clientStats counts what happened to a client's requests.
type clientStats struct {
	requests    atomic.Int64 // HTTP requests sent
	netErrors   atomic.Int64 // connection refused or reset, EOF, timeout
	unavailable atomic.Int64 // 503 service-unavailable
	inUse       atomic.Int64 // 409 idempotency-key-in-use
	internal    atomic.Int64 // 500: always a bug
	replayed    atomic.Int64 // answers marked Idempotent-Replayed
	badProblems atomic.Int64 // 503 or 409 without Retry-After or with the wrong problem type
}

func newClient(t *testing.T, apiKey, keyPrefix string, base func(int) string) *client {
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	c := &client{
		tr:        tr,
		apiKey:    apiKey,
		base:      base,
		keyPrefix: keyPrefix,
		stats:     &clientStats{},
	}
	c.http = &http.Client{Transport: &countingTransport{next: tr, c: c}, Timeout: 10 * time.Second}
	return c
}

// countingTransport counts every attempt in the client's stats, whoever sends
// it: send, or the payments client of the setup helpers. It reads the answer
// whole, so a body cut short counts as a network error. With classify it also
// counts the answer as definite does (retryable), for the payments client,
// which retries by itself. last is the status of the latest answer.
type countingTransport struct {
	next     http.RoundTripper
	c        *client
	classify bool
	last     atomic.Int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st := t.c.stats
	st.requests.Add(1)
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		st.netErrors.Add(1)
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		st.netErrors.Add(1)
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	if a.replayed() {
		st.replayed.Add(1)
	}
	if t.classify {
		t.c.retryable(a)
	}
	t.last.Store(int64(resp.StatusCode))
	return resp, nil
}

// newKey returns a fresh idempotency key carrying the client's prefix.
func (c *client) newKey() string { return c.keyPrefix + uuid.NewString() }

// answer is a response with its body read.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// code returns the code member of a problem body ("" if it has none).
func (a answer) code() string {
	var p struct{ Code string }
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

// field returns a string member of a JSON object body.
func (a answer) field(name string) string {
	var m map[string]any
	_ = json.Unmarshal(a.body, &m)
	s, _ := m[name].(string)
	return s
}

// send makes one attempt. An error means no HTTP answer arrived.
func (c *client) send(ctx context.Context, attempt int, method, path, key string, body []byte) (answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base(attempt)+path, rd)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req) // counted by countingTransport
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body) // already read whole: it cannot fail
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// retryable reports whether an answer means "not decided yet, ask again with
// the same key", and counts it.
func (c *client) retryable(a answer) bool {
	switch a.status {
	case http.StatusServiceUnavailable:
		c.stats.unavailable.Add(1)
		if a.code() != "service-unavailable" || a.header.Get("Retry-After") == "" {
			c.stats.badProblems.Add(1)
		}
		return true
	case http.StatusConflict:
		if a.code() != "idempotency-key-in-use" {
			return false // charge-not-refundable is a definite answer
		}
		c.stats.inUse.Add(1)
		if a.header.Get("Retry-After") == "" {
			c.stats.badProblems.Add(1)
		}
		return true
	case http.StatusInternalServerError:
		// Never a correct answer to a fault of the database or the process,
		// but retrying is what a client would do; the test reports it.
		c.stats.internal.Add(1)
		return true
	}
	return false
}

// maxAttempts bounds the retries of one request.
const maxAttempts = 2000

// definite sends the request until it gets a definite answer (anything but a
// network error, a timeout, 409 in-use, 503 or 500), pausing briefly between
// attempts. It gives up after maxAttempts or when ctx ends.
func (c *client) definite(ctx context.Context, method, path, key string, body []byte) (answer, int, error) {
	seen := attemptsSeen(ctx)
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		a, err := c.send(ctx, attempt, method, path, key, body)
		if seen != nil {
			seen(attempt, a, err)
		}
		if err == nil && !c.retryable(a) {
			return a, attempt, nil
		}
		if ctx.Err() != nil {
			return answer{}, attempt, ctx.Err()
		}
		pause := 5*time.Millisecond + rand.N(20*time.Millisecond)
		if err == nil && a.status != http.StatusInternalServerError {
			pause += 20 * time.Millisecond // the service asked for patience
		}
		select {
		case <-ctx.Done():
			return answer{}, attempt, ctx.Err()
		case <-time.After(pause):
		}
	}
	return answer{}, maxAttempts, errors.New("no definite answer after maxAttempts attempts")
}

type attemptsKey struct{}

// withAttempts returns ctx carrying seen, which definite calls with each
// attempt's answer or error, as httptrace carries its hooks: a scenario
// traces one request that way.
func withAttempts(ctx context.Context, seen func(attempt int, a answer, err error)) context.Context {
	return context.WithValue(ctx, attemptsKey{}, seen)
}

// attemptsSeen returns the hook withAttempts put in ctx, or nil.
func attemptsSeen(ctx context.Context) func(int, answer, error) {
	seen, _ := ctx.Value(attemptsKey{}).(func(int, answer, error))
	return seen
}

// setupPolicy retries the setup steps as definite does: up to maxAttempts,
// with short pauses, for as long as the test's context allows.
var setupPolicy = paymentsclient.RetryPolicy{
	MaxAttempts: maxAttempts,
	BaseDelay:   5 * time.Millisecond,
	MaxDelay:    25 * time.Millisecond,
	MaxElapsed:  time.Hour,
}

// mustCreate runs op, a POST of the payments client, with a fresh key of c's
// (the client retries it with that key until it is answered), and fails the
// test unless the answer is 201; it returns the created object. Every attempt
// is counted in c's stats, as definite counts its own.
func mustCreate[T any](t *testing.T, c *client, what string,
	op func(*paymentsclient.Client, paymentsclient.CallOption) (*paymentsclient.Result[T], error),
) T {
	t.Helper()
	tr := &countingTransport{next: c.tr, c: c, classify: true}
	api := paymentsclient.New(c.base(1), c.apiKey,
		paymentsclient.WithHTTPClient(&http.Client{Transport: tr, Timeout: c.http.Timeout}),
		paymentsclient.WithRetryPolicy(setupPolicy))
	res, err := op(api, paymentsclient.WithIdempotencyKey(c.newKey()))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got := tr.last.Load(); got != http.StatusCreated {
		t.Fatalf("%s: %d, want 201", what, got)
	}
	return res.Data
}

// usd is the account most tests open.
var usd = paymentsclient.NewAccount{Currency: "USD"}

// mustAccount opens an account; see mustCreate.
func (c *client) mustAccount(t *testing.T, ctx context.Context, in paymentsclient.NewAccount) string {
	t.Helper()
	return mustCreate(t, c, "POST /v1/accounts", func(api *paymentsclient.Client, key paymentsclient.CallOption) (*paymentsclient.Result[paymentsclient.Account], error) {
		return api.CreateAccount(ctx, in, key)
	}).ID
}

// mustDeposit funds an account; see mustCreate.
func (c *client) mustDeposit(t *testing.T, ctx context.Context, account string, amount int64) string {
	t.Helper()
	return mustCreate(t, c, "POST /v1/accounts/"+account+"/deposits", func(api *paymentsclient.Client, key paymentsclient.CallOption) (*paymentsclient.Result[paymentsclient.Deposit], error) {
		return api.Deposit(ctx, account, paymentsclient.NewDeposit{Amount: amount}, key)
	}).ID
}

// mustCharge charges a USD account; see mustCreate.
func (c *client) mustCharge(t *testing.T, ctx context.Context, account string, amount int64) string {
	t.Helper()
	return mustCreate(t, c, "POST /v1/charges", func(api *paymentsclient.Client, key paymentsclient.CallOption) (*paymentsclient.Result[paymentsclient.Charge], error) {
		return api.CreateCharge(ctx, paymentsclient.NewCharge{AccountID: account, Amount: amount, Currency: "USD"}, key)
	}).ID
}

// mustRefund refunds amount of a charge; see mustCreate.
func (c *client) mustRefund(t *testing.T, ctx context.Context, charge string, amount int64) string {
	t.Helper()
	return mustCreate(t, c, "POST /v1/charges/"+charge+"/refunds", func(api *paymentsclient.Client, key paymentsclient.CallOption) (*paymentsclient.Result[paymentsclient.Refund], error) {
		return api.CreateRefund(ctx, charge, paymentsclient.NewRefund{Amount: &amount}, key)
	}).ID
}

// get makes one GET attempt and fails the test if no answer arrives.
func (c *client) get(t *testing.T, ctx context.Context, path string) answer {
	t.Helper()
	a, err := c.send(ctx, 1, http.MethodGet, path, "", nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return a
}

// feedBound is how long a test waits for an event to appear in /v1/events. The
// feed lists an event only once every transaction that began before it has
// ended, on the whole server: with other test packages writing to a shared
// local PostgreSQL it lags the commit by as long as their transactions last.
const feedBound = 30 * time.Second

// awaitEvents reads /v1/events?limit=n until it lists n events, and returns
// their ids. It fails the test, naming what it saw, if feedBound passes first.
func (c *client) awaitEvents(t *testing.T, ctx context.Context, n int) []string {
	t.Helper()
	deadline := time.Now().Add(feedBound)
	for {
		a := c.get(t, ctx, "/v1/events?limit="+itoa(int64(n)))
		var feed struct{ Data []struct{ ID string } }
		if err := json.Unmarshal(a.body, &feed); a.status != http.StatusOK || err != nil {
			t.Fatalf("GET /v1/events: %d %s", a.status, a.body)
		}
		if len(feed.Data) >= n {
			ids := make([]string, len(feed.Data))
			for i, e := range feed.Data {
				ids[i] = e.ID
			}
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event feed lists %d of %d events %v after the writes; a transaction that began before them is still open on the server: %s",
				len(feed.Data), n, feedBound, a.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// post makes one POST attempt and fails the test if no answer arrives.
func (c *client) post(t *testing.T, ctx context.Context, path, key, body string) answer {
	t.Helper()
	a, err := c.send(ctx, 1, http.MethodPost, path, key, []byte(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return a
}

// chargeBody is the JSON body of a charge request.
func chargeBody(accountID string, amount int64) []byte {
	return []byte(`{"account_id":"` + accountID + `","amount":` + itoa(amount) + `,"currency":"USD"}`)
}

// authorizeBody is the JSON body of an authorization: a charge with capture
// false.
func authorizeBody(accountID string, amount int64) []byte {
	return []byte(`{"account_id":"` + accountID + `","amount":` + itoa(amount) + `,"currency":"USD","capture":false}`)
}

// captureOp is the capture of all (amount 0) or part of an authorization.
func captureOp(charge, account string, amount int64) op {
	body := []byte(`{}`)
	if amount > 0 {
		body = []byte(`{"amount":` + itoa(amount) + `}`)
	}
	return op{kind: "capture", path: "/v1/charges/" + charge + "/capture", account: account, amount: amount, body: body}
}

// voidOp is the void of an authorization.
func voidOp(charge, account string) op {
	return op{kind: "void", path: "/v1/charges/" + charge + "/void", account: account, body: []byte(`{}`)}
}

// logsMention reports which of the secrets appear in logs.
func logsMention(logs string, secrets ...string) []string {
	var found []string
	for _, s := range secrets {
		if s != "" && strings.Contains(logs, s) {
			found = append(found, s)
		}
	}
	return found
}

// drive sends o until it has a definite answer and returns o with it; on
// giving up the answer's status is 0.
func drive(ctx context.Context, c *client, o op) op {
	o.key = c.newKey()
	a, attempts, err := c.definite(ctx, http.MethodPost, o.path, o.key, o.body)
	if err != nil {
		a = answer{}
	}
	o.answer, o.attempts = a, attempts
	return o
}
