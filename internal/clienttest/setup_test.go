package clienttest_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestMain builds the card processor simulator (procsimtest) for the card
// charges' tests, and runs the tests with pgtest.
func TestMain(m *testing.M) { procsimtest.Main(m) }

// fixture is the real service, in process, on the package's PostgreSQL
// database, with a fresh merchant so that tests sharing the database never
// see each other's money.
type fixture struct {
	t          *testing.T
	url        string
	db         *pgxpool.Pool // to assert the money straight from the tables
	merchantID uuid.UUID
	apiKey     string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	api := testkit.StartAPI(t, pgtest.DatabaseURL(t), testkit.APIOptions{MaxConns: 10, CacheSize: 1000})
	f := &fixture{t: t, url: api.URL, db: api.DB, merchantID: api.MerchantID, apiKey: api.APIKey}
	return f
}

// fast is a retry policy with short waits, so that tests of backoff run in
// milliseconds.
var fast = client.RetryPolicy{MaxAttempts: 4, BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxElapsed: 10 * time.Second}

// client returns a client of the fixture's service at url (the service's own,
// or a proxy's in front of it).
func (f *fixture) client(url string, opts ...client.Option) *client.Client {
	return client.New(url, f.apiKey, opts...)
}

// fundedAccount opens an account in USD holding amount.
func (f *fixture) fundedAccount(amount int64) client.Account {
	f.t.Helper()
	ctx := context.Background()
	c := f.client(f.url)
	acct, err := c.CreateAccount(ctx, client.NewAccount{Currency: "USD"})
	if err != nil {
		f.t.Fatal(err)
	}
	if amount > 0 {
		if _, err := c.Deposit(ctx, acct.Data.ID, client.NewDeposit{Amount: amount}); err != nil {
			f.t.Fatal(err)
		}
	}
	return acct.Data
}

// chargeRows counts the merchant's charge rows of every status.
func (f *fixture) chargeRows() int {
	f.t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE merchant_id = $1`, f.merchantID).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// attempt is one request as a proxy or a transport saw it.
type attempt struct {
	at     time.Time
	key    string
	reqID  string // the X-Request-Id the client sent
	body   []byte
	status int    // the answer's status; 0 when it was lost
	answer []byte // the answer's body
}

// recorder remembers every request that passes through it.
type recorder struct {
	mu       sync.Mutex
	attempts []attempt
}

func (r *recorder) add(a attempt) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, a)
	return len(r.attempts)
}

func (r *recorder) all() []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]attempt(nil), r.attempts...)
}

// proxy is a reverse proxy in front of the real service that answers the
// first len(faults) requests itself, with faults[i], and forwards the rest.
type proxy struct {
	recorder
	url string
}

// fault is a made-up answer: a status, a Retry-After and a problem body.
type fault struct {
	status     int
	retryAfter string
	body       string
	hang       time.Duration // wait this long before answering; unrecorded if the client leaves first
}

var (
	inUse = fault{status: http.StatusConflict, body: `{"type":"/problems/idempotency-key-in-use","title":"Idempotency-Key in use","status":409,` +
		`"detail":"a request with this key is still being processed","code":"idempotency-key-in-use"}`}
	unavailable = fault{status: http.StatusServiceUnavailable, body: `{"type":"/problems/service-unavailable","title":"Service unavailable","status":503,` +
		`"detail":"the database cannot be reached","code":"service-unavailable"}`}
)

func (f *fixture) proxy(faults ...fault) *proxy {
	f.t.Helper()
	target, err := url.Parse(f.url)
	if err != nil {
		f.t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	p := &proxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		p.mu.Lock()
		n := len(p.attempts)
		p.mu.Unlock()
		a := attempt{at: time.Now(), key: r.Header.Get("Idempotency-Key"), reqID: r.Header.Get("X-Request-Id"), body: body}
		if n < len(faults) {
			flt := faults[n]
			if flt.hang > 0 {
				select {
				case <-time.After(flt.hang):
				case <-r.Context().Done():
					return // the client left: no answer to record
				}
			}
			if flt.retryAfter != "" {
				w.Header().Set("Retry-After", flt.retryAfter)
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("X-Request-Id", "req_proxy_"+uuid.NewString())
			w.WriteHeader(flt.status)
			_, _ = io.WriteString(w, flt.body)
			a.status, a.answer = flt.status, []byte(flt.body)
			p.add(a)
			return
		}
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		a.status, a.answer = rec.Code, rec.Body.Bytes()
		p.add(a)
	}))
	f.t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// loseFirst is a transport that delivers its first request to the service and
// then drops the answer, as a connection reset after the commit would: the
// charge happened, and the client cannot know.
type loseFirst struct {
	recorder
	next http.RoundTripper
}

func (l *loseFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := l.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	a := attempt{at: time.Now(), key: r.Header.Get("Idempotency-Key"), reqID: r.Header.Get("X-Request-Id"), body: body,
		status: resp.StatusCode, answer: answer}
	if l.add(a) == 1 {
		return nil, &lostError{}
	}
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	return resp, nil
}

type lostError struct{}

func (*lostError) Error() string { return "connection reset by peer (the test dropped the answer)" }
