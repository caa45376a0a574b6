package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestMain builds the card processor simulator (procsimtest), which the
// card charges' tests run, and runs the tests with pgtest.
func TestMain(m *testing.M) { procsimtest.Main(m) }

// fixture is a running API on a real database, with one merchant signed in.
type fixture struct {
	t          *testing.T
	url        string
	db         *pgxpool.Pool // for asserting the money directly in the tables
	store      testkit.Service
	merchantID uuid.UUID
	apiKey     string
	logs       *testkit.LogBuffer
	front      *idempotency.Front // the server's; its cache counts hits
	metrics    *metrics.Metrics   // the server's; scrape them with scrape
}

type setupOptions struct {
	databaseURL    string
	keyWait        time.Duration
	cacheSize      int
	keyBudget      postgres.KeyBudget
	trustedProxies []netip.Prefix
	holdFor        time.Duration  // CHARGE_AUTHORIZATION_TTL; zero: the default
	allowPrivate   bool           // WEBHOOK_ALLOW_PRIVATE_NETWORKS, for tests whose endpoints are local
	cards          *cards.Options // card charges, with their processor; nil: none
	budget         httpapi.MerchantBudget
}

// setup starts the API on the package database (or opts.databaseURL) and
// registers a fresh merchant, so tests sharing a database never see each
// other's money.
func setup(t *testing.T, opts ...func(*setupOptions)) *fixture {
	t.Helper()
	o := setupOptions{databaseURL: pgtest.DatabaseURL(t), keyWait: 5 * time.Second, cacheSize: 1000}
	for _, opt := range opts {
		opt(&o)
	}
	api := testkit.StartAPI(t, o.databaseURL, testkit.APIOptions{MaxConns: 30, KeyWait: o.keyWait, CacheSize: o.cacheSize,
		KeyBudget: o.keyBudget, TrustedProxies: o.trustedProxies, AuthorizationTTL: o.holdFor,
		AllowPrivateNetworks: o.allowPrivate, Cards: o.cards, Budget: o.budget})
	f := &fixture{t: t, url: api.URL, db: api.DB, store: api.Service, logs: api.Logs, front: api.Front, metrics: api.Metrics,
		merchantID: api.MerchantID, apiKey: api.APIKey}
	return f
}

// otherMerchant returns a fixture for a second merchant on the same server.
func (f *fixture) otherMerchant() *fixture {
	f.t.Helper()
	g := *f
	merchant, key, err := f.store.RegisterMerchant(context.Background(), f.t.Name()+"-other")
	if err != nil {
		f.t.Fatal(err)
	}
	g.merchantID, g.apiKey = merchant, key.Secret
	return &g
}

// scrape returns the server's metrics in the Prometheus text format, as
// cmd/payments serves them on METRICS_ADDR.
func (f *fixture) scrape() string {
	f.t.Helper()
	rec := httptest.NewRecorder()
	f.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		f.t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// reply is a response with its body read.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("response body is not a JSON object: %v\n%s", err, r.body)
	}
	return v
}

// code returns a problem's code member.
func (r reply) code(t *testing.T) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json; body %s", ct, r.body)
	}
	c, _ := r.json(t)["code"].(string)
	return c
}

func (f *fixture) do(req *http.Request) reply {
	f.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	if resp.Header.Get(httpapi.RequestIDHeader) == "" {
		f.t.Errorf("%s %s: no %s header", req.Method, req.URL.Path, httpapi.RequestIDHeader)
	}
	checkContract(f.t, req, resp, body)
	return reply{status: resp.StatusCode, header: resp.Header, body: body}
}

// request builds a request signed in as the fixture's merchant; a key of ""
// sends no Idempotency-Key header.
func (f *fixture) request(method, path, key, body string) *http.Request {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.apiKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

func (f *fixture) post(path, key, body string) reply {
	f.t.Helper()
	return f.do(f.request(http.MethodPost, path, key, body))
}

func (f *fixture) get(path string) reply {
	f.t.Helper()
	return f.do(f.request(http.MethodGet, path, "", ""))
}

// account opens an account in currency funded with deposit (none if 0).
func (f *fixture) account(currency string, deposit int64) string {
	f.t.Helper()
	r := f.post("/v1/accounts", uuid.NewString(), `{"currency":"`+currency+`"}`)
	if r.status != http.StatusCreated {
		f.t.Fatalf("create account: %d %s", r.status, r.body)
	}
	id := r.json(f.t)["id"].(string)
	if deposit > 0 {
		r = f.post("/v1/accounts/"+id+"/deposits", uuid.NewString(), `{"amount":`+itoa(deposit)+`}`)
		if r.status != http.StatusCreated {
			f.t.Fatalf("deposit: %d %s", r.status, r.body)
		}
	}
	return id
}

// balance reads the account's balance straight from the table.
func (f *fixture) balance(accountID string) int64 {
	f.t.Helper()
	return testkit.Balance(context.Background(), f.t, f.db, f.merchantID, accountID)
}

// count runs a COUNT(*) query whose first parameter is the merchant id.
func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), sql, append([]any{f.merchantID}, args...)...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// storedResponse reads the status and the (decompressed) body stored under
// the merchant's key; status 0 when the row holds no response.
func (f *fixture) storedResponse(key string) (int, []byte) {
	f.t.Helper()
	var (
		status   *int
		body     []byte
		encoding *string
	)
	if err := f.db.QueryRow(context.Background(),
		`SELECT status, body, body_encoding FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`,
		f.merchantID, key).Scan(&status, &body, &encoding); err != nil {
		f.t.Fatalf("read the key's row: %v", err)
	}
	if encoding != nil {
		var err error
		if body, err = zstdDecoder.DecodeAll(body, nil); err != nil {
			f.t.Fatalf("decode the stored %s body: %v", *encoding, err)
		}
	}
	if status == nil {
		return 0, body
	}
	return *status, body
}

var zstdDecoder, _ = zstd.NewReader(nil)

func (f *fixture) charges() int {
	return f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1`)
}

func (f *fixture) keys() int {
	return f.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1`)
}

// checkLedger asserts balance = deposits − captured amounts + refunds for the account.
func (f *fixture) checkLedger(accountID string) {
	f.t.Helper()
	id, _ := payment.ParseID(payment.PrefixAccount, accountID)
	var want int64
	err := f.db.QueryRow(context.Background(), `
SELECT coalesce((SELECT sum(amount) FROM deposits WHERE merchant_id = $1 AND account_id = $2), 0)
     - coalesce((SELECT sum(amount_captured - amount_refunded) FROM charges
                 WHERE merchant_id = $1 AND account_id = $2), 0)`,
		f.merchantID, id).Scan(&want)
	if err != nil {
		f.t.Fatal(err)
	}
	if got := f.balance(accountID); got != want {
		f.t.Errorf("balance of %s = %d, but deposits - charges + refunds = %d", accountID, got, want)
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func chargeBody(accountID string, amount int64) string {
	return `{"account_id":"` + accountID + `","amount":` + itoa(amount) + `,"currency":"USD"}`
}
