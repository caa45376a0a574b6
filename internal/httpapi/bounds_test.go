package httpapi_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestAmountBoundsAreInclusive: exactly 1 and exactly 99,999,999 are valid
// amounts for a deposit, a charge and a refund; one past either end is a 400
// that is not stored and moves nothing.
func TestAmountBoundsAreInclusive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 0)
	deposit := func(amount int64) reply {
		return f.post("/v1/accounts/"+acct+"/deposits", uuid.NewString(), `{"amount":`+itoa(amount)+`}`)
	}
	charge := func(amount int64) reply { return f.post("/v1/charges", uuid.NewString(), chargeBody(acct, amount)) }
	refund := func(chargeID string, amount int64) reply {
		return f.post("/v1/charges/"+chargeID+"/refunds", uuid.NewString(), `{"amount":`+itoa(amount)+`}`)
	}
	mustCreate := func(what string, r reply) string {
		t.Helper()
		if r.status != http.StatusCreated {
			t.Fatalf("%s: %d %s, want 201", what, r.status, r.body)
		}
		return r.json(t)["id"].(string)
	}

	const top = payment.MaxAmount
	if top != 99_999_999 || payment.MinAmount != 1 {
		t.Fatalf("the documented bounds are 1 and 99,999,999; the code says %d and %d", payment.MinAmount, top)
	}
	mustCreate("deposit of 1", deposit(1))
	mustCreate("deposit of 99,999,999", deposit(top))
	big := mustCreate("charge of 99,999,999", charge(top)) // balance 1
	small := mustCreate("charge of 1", charge(1))          // balance 0
	mustCreate("refund of 99,999,999", refund(big, top))   // balance 99,999,999
	mustCreate("refund of 1", refund(small, 1))            // balance 100,000,000
	if got := f.balance(acct); got != top+1 {
		t.Fatalf("balance %d, want %d", got, top+1)
	}

	keys, charges := f.keys(), f.charges()
	for _, c := range []struct {
		name string
		r    reply
	}{
		{"deposit of 0", deposit(0)},
		{"deposit of 100,000,000", deposit(top + 1)},
		{"charge of 0", charge(0)},
		{"charge of 100,000,000", charge(top + 1)},
		{"refund of 0", refund(big, 0)},
		{"refund of 100,000,000", refund(big, top+1)},
	} {
		if c.r.status != http.StatusBadRequest || c.r.code(t) != "invalid-request" {
			t.Errorf("%s: %d %s, want 400 invalid-request", c.name, c.r.status, c.r.body)
		}
	}
	if f.keys() != keys || f.charges() != charges || f.balance(acct) != top+1 {
		t.Errorf("refused amounts changed something: %d keys (want %d), %d charges (want %d), balance %d",
			f.keys(), keys, f.charges(), charges, f.balance(acct))
	}
	f.checkLedger(acct)
}

// TestBodySizeBoundIsInclusive: a body of exactly 64 KiB is read and executed,
// one byte more is a 413 that stores nothing, whether the client declares the
// length or streams the body without one (chunked).
func TestBodySizeBoundIsInclusive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	// A charge padded with insignificant whitespace to n bytes.
	body := func(n int) string {
		b := chargeBody(acct, 10)
		return b[:len(b)-1] + strings.Repeat(" ", n-len(b)) + "}"
	}
	for _, c := range []struct {
		name    string
		size    int
		chunked bool
		status  int
	}{
		{"64 KiB, length declared", httpapi.MaxBodyBytes, false, http.StatusCreated},
		{"64 KiB, chunked", httpapi.MaxBodyBytes, true, http.StatusCreated},
		{"64 KiB + 1, length declared", httpapi.MaxBodyBytes + 1, false, http.StatusRequestEntityTooLarge},
		{"64 KiB + 1, chunked", httpapi.MaxBodyBytes + 1, true, http.StatusRequestEntityTooLarge},
	} {
		b := body(c.size)
		if len(b) != c.size {
			t.Fatalf("built a %d-byte body, want %d", len(b), c.size)
		}
		req := f.request(http.MethodPost, "/v1/charges", uuid.NewString(), b)
		if c.chunked {
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(b)), -1
		}
		if r := f.do(req); r.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, r.status, r.body, c.status)
		}
	}
	if f.charges() != 2 || f.balance(acct) != 980 || f.keys() != 4 {
		t.Errorf("%d charges, balance %d, %d keys; want the two 64 KiB charges only: 2, 980, 4", f.charges(), f.balance(acct), f.keys())
	}
}

// TestInFlightWaitIsBoundedBothWays: a request whose key is held by a
// transaction in flight gets 409 idempotency-key-in-use no sooner than the
// wait bound and well before twice it, whichever path it takes: a charge the
// account covers, one it does not, the general path of the other POSTs, and
// a follower coalesced behind a leader in this process. Nothing executes.
func TestInFlightWaitIsBoundedBothWays(t *testing.T) {
	t.Parallel()
	const (
		bound = 2 * time.Second
		// A second wait would take 2 × bound; this leaves a loaded machine
		// 1.5 s for everything else.
		upper = bound + 1500*time.Millisecond
	)
	f := setup(t, func(o *setupOptions) { o.keyWait = bound })

	// Each case has accounts of its own: a charge whose key is held must not
	// also queue behind another case's lock on a shared account.
	cases := []struct {
		name string
		// request returns the path and body of the request to send, on a
		// fresh account funded with deposit.
		request    func(acct string) (path, body string)
		deposit    int64
		concurrent int // requests sent at once with the key
	}{
		{"charge the account covers", func(a string) (string, string) { return "/v1/charges", chargeBody(a, 100) }, 1000, 1},
		{"charge the account does not cover", func(a string) (string, string) { return "/v1/charges", chargeBody(a, 100) }, 0, 1},
		{"deposit", func(a string) (string, string) { return "/v1/accounts/" + a + "/deposits", `{"amount":5}` }, 1000, 1},
		{"account", func(string) (string, string) { return "/v1/accounts", `{"currency":"USD"}` }, 1000, 1},
		{"refund", func(a string) (string, string) { return "/v1/charges/" + f.charge(a, 100) + "/refunds", `{"amount":5}` }, 1000, 1},
		{"coalesced retries of a charge", func(a string) (string, string) { return "/v1/charges", chargeBody(a, 100) }, 1000, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			acct := f.account("USD", c.deposit)
			path, body := c.request(acct)
			charges, balance := f.accountCharges(acct), f.balance(acct)
			key := uuid.NewString()
			f.holdKey(t, key, http.MethodPost, path, body)
			requests := make([]*http.Request, c.concurrent)
			for i := range requests {
				requests[i] = f.request(http.MethodPost, path, key, body)
			}
			type timed struct {
				r      reply
				waited time.Duration
			}
			answers := make(chan timed, c.concurrent)
			began := time.Now()
			for _, req := range requests {
				go func() {
					r := f.do(req)
					answers <- timed{r, time.Since(began)}
				}()
			}
			for range c.concurrent {
				a := <-answers
				if a.r.status != http.StatusConflict || a.r.code(t) != "idempotency-key-in-use" {
					t.Errorf("got %d %s, want 409 idempotency-key-in-use", a.r.status, a.r.body)
				}
				if a.waited < bound || a.waited >= upper {
					t.Errorf("answered after %v; want at least the bound %v and less than %v", a.waited, bound, upper)
				}
			}
			if got, n := f.balance(acct), f.accountCharges(acct); got != balance || n != charges {
				t.Errorf("balance %d and %d charges after the 409s, want %d and %d: a waiting request executed", got, n, balance, charges)
			}
		})
	}
}

// TestRowLockWaitIsUnavailable: a deposit that waits the whole bound for its
// account's row, locked by another transaction, is answered 503 with
// Retry-After and a generic detail (the database's words go only to the log,
// with the request id); nothing is stored, so the retry with the same key
// executes once the row is free. A 4xx is not logged as a failure.
func TestRowLockWaitIsUnavailable(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.keyWait = 300 * time.Millisecond })
	acct := f.account("USD", 1000)
	accountID, _ := payment.ParseID(payment.PrefixAccount, acct)
	ctx := context.Background()
	holder, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT FROM accounts WHERE merchant_id = $1 AND id = $2 FOR UPDATE`, f.merchantID, accountID); err != nil {
		t.Fatal(err)
	}
	keys := f.keys()
	key := uuid.NewString()
	path := "/v1/accounts/" + acct + "/deposits"
	r := f.post(path, key, `{"amount":5}`)
	if r.status != http.StatusServiceUnavailable || r.code(t) != "service-unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("got %d %v %s, want 503 service-unavailable with Retry-After", r.status, r.header, r.body)
	}
	if detail, _ := r.json(t)["detail"].(string); strings.Contains(detail, "lock") || strings.Contains(detail, "55P03") {
		t.Errorf("the database's error reached the client: %s", r.body)
	}
	requestID := r.header.Get(httpapi.RequestIDHeader)
	if !strings.Contains(f.logs.String(), `"msg":"request failed","request_id":"`+requestID+`"`) ||
		!strings.Contains(f.logs.String(), "SQLSTATE 55P03") {
		t.Errorf("no log line with the request id %s and the cause:\n%s", requestID, f.logs.String())
	}
	if f.keys() != keys || f.balance(acct) != 1000 {
		t.Errorf("%d keys (want %d), balance %d (want 1000) after the 503", f.keys(), keys, f.balance(acct))
	}

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.post(path, key, `{"amount":5}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry once the row is free: %d %s, want a fresh 201", r.status, r.body)
	}
	if f.balance(acct) != 1005 {
		t.Errorf("balance %d, want 1005", f.balance(acct))
	}
	f.checkLedger(acct)

	// A refusal of the client's request is not a failure of the service.
	nf := f.get("/v1/charges/ch_" + strings.Repeat("e", 32))
	if nf.status != http.StatusNotFound {
		t.Fatalf("GET an unknown charge: %d %s", nf.status, nf.body)
	}
	if strings.Contains(f.logs.String(), `"msg":"request failed","request_id":"`+nf.header.Get(httpapi.RequestIDHeader)+`"`) {
		t.Error("a 404 was logged as a failed request")
	}
}

// accountCharges counts the charges of one account.
func (f *fixture) accountCharges(accountID string) int {
	f.t.Helper()
	id, _ := payment.ParseID(payment.PrefixAccount, accountID)
	return f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND account_id = $2`, id)
}

// holdKey claims key for the request in a transaction that stays open until
// the test ends, as a request in flight on another replica would.
func (f *fixture) holdKey(t *testing.T, key, method, path, body string) {
	t.Helper()
	canonical, err := idempotency.Canonicalize([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	fp := idempotency.NewFingerprint(method, path, canonical)
	ctx := context.Background()
	holder, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	// What a request in flight holds: the key's advisory lock and its row.
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`, f.merchantID, key); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ($1, $2, $3)`,
		f.merchantID, key, fp[:]); err != nil {
		t.Fatal(err)
	}
}

// TestInFlightKeyHoldsNoAccount: while a charge waits for its key, held by a
// request in flight elsewhere (another replica: here a transaction of the
// test's own), it holds nothing: the account's other charges and deposits go
// through at once, not after the wait bound.
func TestInFlightKeyHoldsNoAccount(t *testing.T) {
	t.Parallel()
	const bound = 2 * time.Second
	f := setup(t, func(o *setupOptions) { o.keyWait = bound })
	acct := f.account("USD", 10_000)
	key := uuid.NewString()
	body := chargeBody(acct, 100)
	f.holdKey(t, key, http.MethodPost, "/v1/charges", body)

	waiting := make(chan reply, 1)
	go func() { waiting <- f.post("/v1/charges", key, body) }()
	time.Sleep(200 * time.Millisecond) // let it start waiting for the key

	began := time.Now()
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			path, b := "/v1/charges", chargeBody(acct, 10)
			if i%2 == 1 {
				path, b = "/v1/accounts/"+acct+"/deposits", `{"amount":10}`
			}
			if r := f.post(path, uuid.NewString(), b); r.status != http.StatusCreated {
				t.Errorf("%s: %d %s", path, r.status, r.body)
			}
		})
	}
	wg.Wait()
	if took := time.Since(began); took > bound/2 {
		t.Errorf("the account's other requests took %v behind a key in flight; the waiting charge holds the account", took)
	}
	if r := <-waiting; r.status != http.StatusConflict {
		t.Errorf("the charge whose key is held got %d %s, want 409 after the bound", r.status, r.body)
	}
	if got := f.balance(acct); got != 10_000 {
		t.Errorf("balance %d, want 10000 (five charges and five deposits of 10)", got)
	}
}

// TestDatabaseReplayTouchesNoAccount: a replay answered from the database (no
// cache here) reads the key's row and nothing else: with the account's row
// locked by another transaction, it is answered at once, byte for byte, and
// no transaction of the service rolls back to get there.
func TestDatabaseReplayTouchesNoAccount(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) {
		// A database of its own: its rollback count is this test's alone.
		o.databaseURL, o.cacheSize, o.keyWait = pgtest.NewDatabase(t), 0, 2*time.Second
	})
	acct := f.account("USD", 1000)
	key := uuid.NewString()
	first := f.post("/v1/charges", key, chargeBody(acct, 100))
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.status, first.body)
	}
	ctx := context.Background()
	holder, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	accountID, _ := payment.ParseID(payment.PrefixAccount, acct)
	if _, err := holder.Exec(ctx, `SELECT FROM accounts WHERE merchant_id = $1 AND id = $2 FOR UPDATE`, f.merchantID, accountID); err != nil {
		t.Fatal(err)
	}
	var rollbacks int64
	count := func() int64 {
		t.Helper()
		var n int64
		if err := f.db.QueryRow(ctx, `SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rollbacks = count()
	began := time.Now()
	again := f.post("/v1/charges", key, chargeBody(acct, 100))
	if took := time.Since(began); took > time.Second {
		t.Errorf("the replay took %v with the account locked: it waited for the account", took)
	}
	if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %s, want the first answer replayed", again.status, again.body)
	}
	// The statistics collector reports with a delay of its own; a rollback
	// would show within a second.
	time.Sleep(time.Second)
	if n := count(); n != rollbacks {
		t.Errorf("%d transactions rolled back while answering a replay", n-rollbacks)
	}
}

// TestDocsRefusalsAreProblems: /docs hands its refusals to the API's one
// problem table, so an unknown file and a wrong method are problems like any
// other answer.
func TestDocsRefusalsAreProblems(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.New(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), httpapi.Options{Docs: true}))
	defer srv.Close()
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodGet, "/docs/nope.html", http.StatusNotFound, "not-found"},
		{http.MethodPost, "/docs/", http.StatusMethodNotAllowed, "method-not-allowed"},
	} {
		req, err := http.NewRequest(c.method, srv.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(string(body), `"code":"`+c.code+`"`) {
			t.Errorf("%s %s: %d %s %s, want %d problem %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Content-Type"), body, c.status, c.code)
		}
	}
}
