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
)

// client is a merchant's HTTP client that retries like a careful integrator:
// a request that failed or timed out is sent again with the same key and the
// same body until it gets a definite answer.
type client struct {
	http   *http.Client
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
	return &client{
		http:      &http.Client{Transport: tr, Timeout: 10 * time.Second},
		apiKey:    apiKey,
		base:      base,
		keyPrefix: keyPrefix,
		stats:     &clientStats{},
	}
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
	c.stats.requests.Add(1)
	resp, err := c.http.Do(req)
	if err != nil {
		c.stats.netErrors.Add(1)
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.stats.netErrors.Add(1)
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	if a.replayed() {
		c.stats.replayed.Add(1)
	}
	return a, nil
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
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		a, err := c.send(ctx, attempt, method, path, key, body)
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

// mustCreate sends a POST until it is answered and fails the test unless the
// answer is 201; it returns the created object's id.
func (c *client) mustCreate(t *testing.T, ctx context.Context, path string, body string) string {
	t.Helper()
	a, _, err := c.definite(ctx, http.MethodPost, path, c.newKey(), []byte(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	if a.status != http.StatusCreated {
		t.Fatalf("POST %s: %d %s", path, a.status, a.body)
	}
	return a.field("id")
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
