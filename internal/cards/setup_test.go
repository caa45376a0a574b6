package cards_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

func TestMain(m *testing.M) { procsimtest.Main(m) }

// webhookSecret signs the simulator's webhooks in every test.
const webhookSecret = "whsec_test"

// bundle is one test's service, in process over its own database, and the
// simulator it charges at, a real process, behind a proxy that can fail
// what the test says.
type bundle struct {
	dbURL  string
	api    *testkit.API
	sim    *procsimtest.Sim
	proxy  *faultProxy
	client *http.Client
}

// setup starts the service with o (small bounds by default) and a simulator
// whose decision deadline is o's, with flags.
func setup(t *testing.T, o cards.Options, flags ...string) *bundle {
	t.Helper()
	return setupOn(t, pgtest.NewDatabase(t), o, flags...)
}

// setupOn is setup on the database at dbURL: a second service there is
// another deployment's, configured for a simulator of its own.
func setupOn(t *testing.T, dbURL string, o cards.Options, flags ...string) *bundle {
	t.Helper()
	o = testBounds(o, 4*time.Second)
	o.WebhookSecret = webhookSecret
	b := &bundle{dbURL: dbURL, proxy: newFaultProxy(t), client: &http.Client{Timeout: 30 * time.Second}}
	// Keep-alives off: Go's client would send a request again by itself,
	// with its key, when a reused connection closes before the answer, and
	// a lost answer would come back as a replay.
	o.Processor = processor.NewSimulator(b.proxy.srv.URL, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}})
	b.api = testkit.StartAPI(t, dbURL, testkit.APIOptions{Cards: &o})
	flags = append([]string{"-decision-deadline", o.DecisionDeadline.String(),
		"-webhook-url", b.api.URL + "/v1/processor/events", "-webhook-secret", webhookSecret}, flags...)
	b.sim = procsimtest.Start(t, flags...)
	b.proxy.to(b.sim.URL())
	return b
}

// testBounds gives o the tests' short bounds, where it leaves them zero, so
// that recovery ends within a test: decisionDeadline is the processor's.
func testBounds(o cards.Options, decisionDeadline time.Duration) cards.Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.CallTimeout, 2*time.Second)
	def(&o.DecisionDeadline, decisionDeadline)
	def(&o.Wait, 2*time.Second)
	def(&o.Interval, 50*time.Millisecond)
	def(&o.Backoff, 100*time.Millisecond)
	def(&o.MaxBackoff, 400*time.Millisecond)
	o.Poll, o.KeyWait = 20*time.Millisecond, 3*time.Second
	return o
}

// answer is an HTTP answer as the client got it.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// post sends body to path under key with the test merchant's API key.
func (b *bundle) post(t *testing.T, path, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.api.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+b.api.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return b.do(t, req)
}

// get reads path with the test merchant's API key.
func (b *bundle) get(t *testing.T, path string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.api.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+b.api.APIKey)
	return b.do(t, req)
}

func (b *bundle) do(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, body}
}

// charge charges pm 1000 EUR under key.
func (b *bundle) charge(t *testing.T, key, pm string) answer {
	t.Helper()
	return b.post(t, "/v1/charges", key, `{"payment_method": "`+pm+`", "amount": 1000, "currency": "EUR"}`)
}

// chargeID is the id of the charge an answer names (201, 202, 402).
func chargeID(t *testing.T, a answer) string {
	t.Helper()
	var v struct {
		ID       string `json:"id"`
		ChargeID string `json:"charge_id"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil || v.ID+v.ChargeID == "" {
		t.Fatalf("no charge id in %d %s (%v)", a.status, a.body, err)
	}
	return v.ID + v.ChargeID
}

// rows is what the service's tables hold about one charge.
type rows struct {
	charges, ops     int
	status, opState  string
	failure, decline string
	events           []string // the charge's events, in order
	keyStatus        int      // 0 while the key is bound
	processorEvents  int
	attempts         int
}

// rowsOf reads what the tables hold about the charge id (ch_...).
func (b *bundle) rowsOf(t *testing.T, id string) rows {
	t.Helper()
	ctx := context.Background()
	var r rows
	var keyStatus *int32
	// One snapshot: a change committed between two statements would show
	// half done.
	tx, err := b.api.DB.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = tx.QueryRow(ctx, `
SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1),
       (SELECT count(*) FROM processor_operations WHERE merchant_id = $1),
       c.status, coalesce(c.failure_code, ''), coalesce(c.decline_code, ''), o.state, o.attempts,
       (SELECT status FROM idempotency_keys k WHERE k.merchant_id = $1 AND k.operation_id = o.id),
       (SELECT count(*) FROM processor_events e WHERE e.merchant_id = $1 AND e.operation_id = o.id)
FROM charges c JOIN processor_operations o ON o.merchant_id = c.merchant_id AND o.charge_id = c.id AND o.kind = 'authorize'
WHERE c.merchant_id = $1 AND c.id = $2`, b.api.MerchantID, uuidOf(t, id)).
		Scan(&r.charges, &r.ops, &r.status, &r.failure, &r.decline, &r.opState, &r.attempts, &keyStatus, &r.processorEvents)
	if err != nil {
		t.Fatalf("read the rows of %s: %v", id, err)
	}
	if keyStatus != nil {
		r.keyStatus = int(*keyStatus)
	}
	evs, err := tx.Query(ctx, `SELECT type FROM events WHERE merchant_id = $1 AND aggregate_id = $2 ORDER BY tx_id, seq`,
		b.api.MerchantID, uuidOf(t, id))
	if err != nil {
		t.Fatal(err)
	}
	defer evs.Close()
	for evs.Next() {
		var typ string
		if err := evs.Scan(&typ); err != nil {
			t.Fatal(err)
		}
		r.events = append(r.events, typ)
	}
	return r
}

// waitFor waits up to limit for the charge's status, failing the test past it.
func (b *bundle) waitFor(t *testing.T, id, status string, limit time.Duration) rows {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		r := b.rowsOf(t, id)
		if r.status == status {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("charge %s is %s (operation %s, code %q) after %s, want %s; service log:\n%s", id, r.status, r.opState,
				r.failure, limit, status, b.api.Logs.Tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// audit is what the simulator did under a reference.
type audit struct {
	Approvals, Reversals, ReversalRefusals, Expiries int
	Captures, Voids, Refunds                         int
	CapturedAmount, RefundedAmount                   int64
	found                                            bool
}

func (b *bundle) audit(t *testing.T, id string) audit {
	t.Helper()
	resp, err := http.Get(b.sim.URL() + "/v1/audit?reference=" + url.QueryEscape(id))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		References []struct {
			Approvals        int   `json:"approvals"`
			Reversals        int   `json:"reversals"`
			ReversalRefusals int   `json:"reversal_refusals"`
			Expiries         int   `json:"expiries"`
			Captures         int   `json:"captures"`
			CapturedAmount   int64 `json:"captured_amount"`
			Voids            int   `json:"voids"`
			Refunds          int   `json:"refunds"`
			RefundedAmount   int64 `json:"refunded_amount"`
		} `json:"references"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if len(v.References) == 0 {
		return audit{}
	}
	r := v.References[0]
	return audit{Approvals: r.Approvals, Reversals: r.Reversals, ReversalRefusals: r.ReversalRefusals, Expiries: r.Expiries,
		Captures: r.Captures, Voids: r.Voids, Refunds: r.Refunds, CapturedAmount: r.CapturedAmount, RefundedAmount: r.RefundedAmount,
		found: true}
}

// faultProxy stands between the service and the simulator, and fails what
// the test says: it loses the answers of authorizations, or of captures,
// voids and refunds (after the simulator processed them), and answers
// lookups or reversals 503 without passing them on.
type faultProxy struct {
	srv                                           *httptest.Server
	target                                        atomic.Pointer[url.URL]
	loseAuthorizations, failLookups, failReverses atomic.Bool
	loseFollowUps                                 atomic.Bool
}

func newFaultProxy(t *testing.T) *faultProxy {
	p := &faultProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *faultProxy) to(target string) {
	u, _ := url.Parse(target)
	p.target.Store(u)
}

func (p *faultProxy) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case p.failLookups.Load() && r.Method == http.MethodGet && r.URL.Path == "/v1/payments",
		p.failReverses.Load() && r.URL.Path == "/v1/reversals":
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error": {"code": "proxy_down", "message": "the test's proxy refuses it"}}`))
		return
	case p.loseAuthorizations.Load() && r.URL.Path == "/v1/authorizations",
		p.loseFollowUps.Load() && r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/payments/"):
		body, _ := io.ReadAll(r.Body)
		out, _ := http.NewRequest(r.Method, p.target.Load().String()+r.URL.Path, bytes.NewReader(body))
		out.Header = r.Header.Clone()
		if resp, err := http.DefaultTransport.RoundTrip(out); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		panic(http.ErrAbortHandler) // the connection closes unanswered
	}
	httputil.NewSingleHostReverseProxy(p.target.Load()).ServeHTTP(w, r)
}

// uuidOf is the uuid of a charge id (ch_...).
func uuidOf(t *testing.T, id string) uuid.UUID {
	t.Helper()
	u, ok := payment.ParseID(payment.PrefixCharge, id)
	if !ok {
		t.Fatalf("%q is no charge id", id)
	}
	return u
}
