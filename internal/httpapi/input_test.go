package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestBadInputIsRefusedBeforeTheKeyIsClaimed: every malformed request gets a
// problem naming what is wrong, changes no money and stores no key, so the
// corrected request can then use the same key.
func TestBadInputIsRefusedBeforeTheKeyIsClaimed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	keysBefore := f.keys()
	valid := chargeBody(acct, 100)
	withField := func(field string) string {
		return `{"account_id":"` + acct + `","amount":100,"currency":"USD",` + field + `}`
	}

	cases := []struct {
		name        string
		key         string // "-" sends no header
		contentType string
		body        string
		status      int
		code        string
		field       string
	}{
		{"missing key", "-", "application/json", valid, 400, "idempotency-key-missing", ""},
		{"key too long", strings.Repeat("k", 256), "application/json", valid, 400, "idempotency-key-invalid", ""},
		{"key with a space", "a b", "application/json", valid, 400, "idempotency-key-invalid", ""},
		{"key not ASCII", "clé", "application/json", valid, 400, "idempotency-key-invalid", ""},
		{"not JSON content type", "", "text/plain", valid, 415, "unsupported-media-type", ""},
		{"no content type", "", "", valid, 415, "unsupported-media-type", ""},
		{"latin-1 charset", "", "application/json; charset=latin1", valid, 415, "unsupported-media-type", ""},
		{"body over 64 KiB", "", "application/json", withField(`"description":"` + strings.Repeat("x", 65<<10) + `"`), 413, "request-too-large", ""},
		{"empty body", "", "application/json", " ", 400, "invalid-request", ""},
		{"malformed JSON", "", "application/json", `{"amount":`, 400, "invalid-request", ""},
		{"trailing data", "", "application/json", valid + `{}`, 400, "invalid-request", ""},
		{"duplicate member", "", "application/json", withField(`"amount":5`), 400, "invalid-request", ""},
		{"array body", "", "application/json", `[1]`, 400, "invalid-request", ""},
		{"unknown field", "", "application/json", withField(`"capture_method":"manual"`), 400, "invalid-request", "capture_method"},
		{"field name in another case", "", "application/json", withField(`"Amount":6`), 400, "invalid-request", "Amount"},
		{"amount missing", "", "application/json", `{"account_id":"` + acct + `","currency":"USD"}`, 400, "invalid-request", "amount"},
		{"amount zero", "", "application/json", chargeBody(acct, 0), 400, "invalid-request", "amount"},
		{"amount negative", "", "application/json", chargeBody(acct, -5), 400, "invalid-request", "amount"},
		{"amount too large", "", "application/json", chargeBody(acct, 100_000_000), 400, "invalid-request", "amount"},
		{"amount overflows int64", "", "application/json", `{"account_id":"` + acct + `","amount":99999999999999999999,"currency":"USD"}`, 400, "invalid-request", "amount"},
		{"amount fractional", "", "application/json", `{"account_id":"` + acct + `","amount":1.5,"currency":"USD"}`, 400, "invalid-request", "amount"},
		{"amount as string", "", "application/json", `{"account_id":"` + acct + `","amount":"100","currency":"USD"}`, 400, "invalid-request", "amount"},
		{"currency lowercase", "", "application/json", `{"account_id":"` + acct + `","amount":100,"currency":"usd"}`, 400, "invalid-request", "currency"},
		{"currency unknown", "", "application/json", `{"account_id":"` + acct + `","amount":100,"currency":"ABC"}`, 400, "invalid-request", "currency"},
		{"currency missing", "", "application/json", `{"account_id":"` + acct + `","amount":100}`, 400, "invalid-request", "currency"},
		{"account id malformed", "", "application/json", chargeBody("acct_nope", 100), 400, "invalid-request", "account_id"},
		{"account id missing", "", "application/json", `{"amount":100,"currency":"USD"}`, 400, "invalid-request", "account_id"},
		{"description too long", "", "application/json", withField(`"description":"` + strings.Repeat("d", 1001) + `"`), 400, "invalid-request", "description"},
		{"NUL in description", "", "application/json", withField(`"description":"a\u0000b"`), 400, "invalid-request", "description"},
		{"NUL in metadata", "", "application/json", withField(`"metadata":{"k":"\u0000"}`), 400, "invalid-request", "metadata"},
		{"metadata not strings", "", "application/json", withField(`"metadata":{"a":1}`), 400, "invalid-request", "metadata.a"},
		{"metadata nested object", "", "application/json", withField(`"metadata":{"ok":"v","k":{"x":"y"},"z":[1]}`), 400, "invalid-request", "metadata.k"},
		{"invalid UTF-8", "", "application/json", "{\"account_id\":\"\xff\"}", 400, "invalid-request", ""},
		// null is no value the spec allows, and never "absent": it would
		// read as the default, which for capture is to take the money now.
		{"null body", "", "application/json", "null", 400, "invalid-request", ""},
		{"amount null", "", "application/json", `{"account_id":"` + acct + `","amount":null,"currency":"USD"}`, 400, "invalid-request", "amount"},
		{"capture null", "", "application/json", withField(`"capture":null`), 400, "invalid-request", "capture"},
		{"description null", "", "application/json", withField(`"description":null`), 400, "invalid-request", "description"},
		{"metadata null", "", "application/json", withField(`"metadata":null`), 400, "invalid-request", "metadata"},
		{"two content types", "", "application/json\x00text/plain", valid, 400, "invalid-request", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			if key == "" {
				key = uuid.NewString()
			}
			req := f.request(http.MethodPost, "/v1/charges", "", tc.body)
			if key != "-" {
				req.Header["Idempotency-Key"] = []string{key}
			}
			if tc.contentType == "" {
				req.Header.Del("Content-Type")
			} else {
				// A NUL separates the values of a header sent twice.
				req.Header["Content-Type"] = strings.Split(tc.contentType, "\x00")
			}
			r := f.do(req)
			if r.status != tc.status || r.code(t) != tc.code {
				t.Fatalf("got %d %s, want %d %s", r.status, r.body, tc.status, tc.code)
			}
			p := r.json(t)
			if detail, _ := p["detail"].(string); detail == "" {
				t.Errorf("problem without a detail: %s", r.body)
			}
			if tc.field != "" && p["field"] != tc.field {
				t.Errorf("field = %v, want %q; %s", p["field"], tc.field, r.body)
			}
			if key != "-" && ValidKeyForRetry(key) {
				// The refusal stored nothing: the same key now executes the valid request.
				ok := f.post("/v1/charges", key, chargeBody(acct, 1))
				if ok.status != http.StatusCreated || ok.header.Get("Idempotent-Replayed") != "" {
					t.Errorf("valid request under the refused request's key: %d %s", ok.status, ok.body)
				}
			}
		})
	}
	// Only the valid follow-ups (1 each) moved money.
	followUps := int64(f.keys() - keysBefore)
	if got, want := f.balance(acct), 1000-followUps; got != want {
		t.Errorf("balance = %d, want %d: refused requests must change nothing", got, want)
	}
	if n := f.charges(); int64(n) != followUps {
		t.Errorf("%d charges, want %d (the valid follow-ups only)", n, followUps)
	}
	f.checkLedger(acct)
}

// ValidKeyForRetry reports whether a case's key is a usable key, so its
// follow-up request is meaningful.
func ValidKeyForRetry(key string) bool {
	return len(key) <= 255 && !strings.ContainsAny(key, " é")
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	f := setup(t)
	cases := []struct{ name, header string }{
		{"none", ""},
		{"not bearer", "Basic " + f.apiKey},
		{"another scheme as long as Bearer", "Token_ " + f.apiKey},
		{"unknown key", "Bearer sk_unknown"},
		{"empty bearer", "Bearer "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := f.request(http.MethodPost, "/v1/accounts", uuid.NewString(), `{"currency":"USD"}`)
			req.Header.Del("Authorization")
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			if r := f.do(req); r.status != http.StatusUnauthorized || r.code(t) != "unauthorized" {
				t.Errorf("got %d %s, want 401", r.status, r.body)
			}
		})
	}
	if n := f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1`); n != 0 {
		t.Errorf("%d accounts created without authentication", n)
	}
}

func TestAccountsAndDeposits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := uuid.NewString()
	body := `{"currency":"EUR","description":"Ana's wallet","metadata":{"customer":"c_1"}}`
	r := f.post("/v1/accounts", key, body)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	acct := r.json(t)
	id := acct["id"].(string)
	if acct["object"] != "account" || acct["currency"] != "EUR" || acct["balance"] != float64(0) ||
		acct["description"] != "Ana's wallet" || r.header.Get("Location") != "/v1/accounts/"+id {
		t.Errorf("account = %s, Location %q", r.body, r.header.Get("Location"))
	}
	if again := f.post("/v1/accounts", key, body); again.status != http.StatusCreated || string(again.body) != string(r.body) {
		t.Errorf("replayed account creation: %d %s", again.status, again.body)
	}
	if n := f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1`); n != 1 {
		t.Errorf("%d accounts, want 1", n)
	}

	depKey := uuid.NewString()
	d := f.post("/v1/accounts/"+id+"/deposits", depKey, `{"amount":2500}`)
	if d.status != http.StatusCreated || d.json(t)["currency"] != "EUR" {
		t.Fatalf("deposit: %d %s", d.status, d.body)
	}
	f.post("/v1/accounts/"+id+"/deposits", depKey, `{"amount":2500}`)
	if got := f.balance(id); got != 2500 {
		t.Errorf("balance = %d, want 2500 (deposited once)", got)
	}
	if g := f.get(d.header.Get("Location")); g.status != http.StatusOK || string(g.body) != string(d.body) {
		t.Errorf("GET deposit = %d %s, want %s", g.status, g.body, d.body)
	}
	if g := f.get("/v1/accounts/" + id); g.status != http.StatusOK || g.json(t)["balance"] != float64(2500) {
		t.Errorf("GET account = %d %s", g.status, g.body)
	}

	missing := "/v1/accounts/acct_" + strings.Repeat("f", 32) + "/deposits"
	nf := f.post(missing, "dep-missing", `{"amount":5}`)
	if nf.status != http.StatusNotFound || nf.code(t) != "not-found" {
		t.Errorf("deposit to unknown account: %d %s", nf.status, nf.body)
	}
	if again := f.post(missing, "dep-missing", `{"amount":5}`); again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the 404 was not stored: %d %v", again.status, again.header)
	}
	for _, path := range []string{"/v1/accounts/nope", "/v1/charges/ch_nope", "/v1/accounts/" + id + "/deposits/dep_x"} {
		if g := f.get(path); g.status != http.StatusNotFound || g.code(t) != "not-found" {
			t.Errorf("GET %s = %d %s", path, g.status, g.body)
		}
	}
}

// TestNotFoundNamesTheObject: every 404 says which object the merchant does
// not have, by the id the client sent, on reads and on writes (where the
// answer is stored like any other).
func TestNotFoundNamesTheObject(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	ch := f.charge(acct, 10)
	unknownAcct := "acct_" + strings.Repeat("a", 32)
	unknownCh := "ch_" + strings.Repeat("b", 32)
	unknownDep := "dep_" + strings.Repeat("c", 32)
	unknownRe := "re_" + strings.Repeat("d", 32)
	for _, c := range []struct {
		name, method, path, body, code, detail string
	}{
		{"account", "GET", "/v1/accounts/" + unknownAcct, "", "not-found", `not found: your merchant has no account "` + unknownAcct + `"`},
		{"deposit", "GET", "/v1/accounts/" + acct + "/deposits/" + unknownDep, "", "not-found", `not found: your merchant has no deposit "` + unknownDep + `"`},
		{"charge", "GET", "/v1/charges/" + unknownCh, "", "not-found", `not found: your merchant has no charge "` + unknownCh + `"`},
		{"refund", "GET", "/v1/charges/" + ch + "/refunds/" + unknownRe, "", "not-found", `not found: your merchant has no refund "` + unknownRe + `"`},
		{"charges of an account", "GET", "/v1/charges?account_id=" + unknownAcct, "", "not-found", `not found: your merchant has no account "` + unknownAcct + `"`},
		{"deposit into an account", "POST", "/v1/accounts/" + unknownAcct + "/deposits", `{"amount":5}`, "not-found", `not found: your merchant has no account "` + unknownAcct + `"`},
		{"charge of an account", "POST", "/v1/charges", chargeBody(unknownAcct, 5), "account-not-found", `account not found: your merchant has no account "` + unknownAcct + `"`},
		{"refund of a charge", "POST", "/v1/charges/" + unknownCh + "/refunds", `{}`, "not-found", `not found: your merchant has no charge "` + unknownCh + `"`},
	} {
		key := ""
		if c.method == http.MethodPost {
			key = uuid.NewString()
		}
		r := f.do(f.request(c.method, c.path, key, c.body))
		if r.status != http.StatusNotFound || r.code(t) != c.code || r.json(t)["detail"] != c.detail {
			t.Errorf("%s: %d %s, want 404 %s with detail %s", c.name, r.status, r.body, c.code, c.detail)
		}
	}
}

// TestAccessLog: each request is logged once, with its request id, method,
// route pattern (no ids from the path), status, size and duration in
// milliseconds; the duration is within what the client waited.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	req := f.request(http.MethodGet, "/v1/accounts/"+acct, "", "")
	req.Header.Set("X-Request-Id", "access-log-test")
	began := time.Now()
	r := f.do(req)
	waited := time.Since(began)
	// The line is written, and the duration taken, before the handler
	// returns, and a body this small reaches the client only after that.

	var lines []map[string]any
	for _, line := range strings.Split(f.logs.String(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["msg"] == "request" && l["request_id"] == "access-log-test" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d access log lines for the request, want 1:\n%s", len(lines), f.logs.String())
	}
	l := lines[0]
	if l["method"] != "GET" || l["route"] != "/v1/accounts/{id}" || l["status"] != float64(r.status) || l["bytes"] != float64(len(r.body)) {
		t.Errorf("access log line %v; want GET /v1/accounts/{id} %d, %d bytes", l, r.status, len(r.body))
	}
	if ms, ok := l["duration_ms"].(float64); !ok || ms < 0 || ms > float64(waited.Microseconds())/1000 {
		t.Errorf("duration_ms %v, want between 0 and the %v the client waited", l["duration_ms"], waited)
	}
}

// TestProbesAreNotAccessLogged: the health probes a load balancer sends every
// few seconds are logged at DEBUG, so the service's INFO log (the fixture's,
// as in production by default) holds none of them, while the API request
// between them is there.
func TestProbesAreNotAccessLogged(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for i, path := range []string{"/healthz", "/readyz", "/v1/charges", "/healthz"} {
		req := f.request(http.MethodGet, path, "", "")
		req.Header.Set("X-Request-Id", fmt.Sprintf("probe-log-%d", i))
		if r := f.do(req); r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	logged := map[string]bool{}
	for _, line := range strings.Split(f.logs.String(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["msg"] == "request" {
			if id, _ := l["request_id"].(string); strings.HasPrefix(id, "probe-log-") {
				logged[id] = true
			}
		}
	}
	if len(logged) != 1 || !logged["probe-log-2"] {
		t.Errorf("access log lines for %v; want only probe-log-2 (GET /v1/charges), not the probes:\n%s", logged, f.logs.String())
	}
}

// TestMetrics: a charge, its replay and a refused reuse show in the metrics,
// no raw key becomes a label, and the API port does not serve them.
func TestMetrics(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	key := "metrics-key-" + uuid.NewString()
	f.post("/v1/charges", key, chargeBody(acct, 10))
	f.post("/v1/charges", key, chargeBody(acct, 10))
	f.post("/v1/charges", key, chargeBody(acct, 11))
	f.post("/v1/charges", uuid.NewString(), chargeBody(acct, 5000))

	req, _ := http.NewRequest(http.MethodGet, f.url+"/metrics", nil)
	if r := f.do(req); r.status != http.StatusNotFound {
		t.Errorf("GET /metrics on the API: %d, want 404", r.status)
	}
	body := f.scrape()
	for _, want := range []string{
		`payments_charges_total{status="succeeded"}`,
		`payments_charges_total{status="failed"}`,
		`payments_idempotency_outcomes_total{outcome="replayed"}`,
		`payments_idempotency_outcomes_total{outcome="mismatch"}`,
		`payments_http_request_duration_seconds_bucket{method="POST",route="/v1/charges",status="201"`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the metrics lack %s", want)
		}
	}
	if strings.Contains(body, key) || strings.Contains(body, acct) {
		t.Error("a key or an id became a metric label")
	}
}

func TestOperationalEndpoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for path, want := range map[string]int{
		"/healthz":                         200,
		"/readyz":                          200,
		"/openapi.yaml":                    200,
		"/problems/idempotency-key-reused": 200,
		"/problems/nope":                   404,
		"/nope":                            404,
	} {
		req, _ := http.NewRequest(http.MethodGet, f.url+path, nil)
		if r := f.do(req); r.status != want {
			t.Errorf("GET %s = %d, want %d", path, r.status, want)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, f.url+"/v1/charges", nil)
	req.Header.Set("Authorization", "Bearer "+f.apiKey)
	if r := f.do(req); r.status != http.StatusMethodNotAllowed || r.code(t) != "method-not-allowed" || r.header.Get("Allow") != "GET, POST" {
		t.Errorf("DELETE /v1/charges = %d %s, Allow %q", r.status, r.body, r.header.Get("Allow"))
	}
	req, _ = http.NewRequest(http.MethodGet, f.url+"/healthz", nil)
	req.Header.Set("X-Request-Id", "trace-123")
	if r := f.do(req); r.header.Get("X-Request-Id") != "trace-123" {
		t.Errorf("inbound request id not echoed: %q", r.header.Get("X-Request-Id"))
	}
	// The longest id the spec allows, 128 characters, is adopted too.
	long := strings.Repeat("r", 128)
	req, _ = http.NewRequest(http.MethodGet, f.url+"/healthz", nil)
	req.Header.Set("X-Request-Id", long)
	if got := f.do(req).header.Get("X-Request-Id"); got != long {
		t.Errorf("a 128-character request id came back as %q", got)
	}
}

// TestKeyedPostsAccessLineNamesMerchantAndKeyHash: the access line of a keyed
// POST carries its merchant and its key's hash (the audit lines' hash), the
// first use of a key as much as a replay, so that a request can be followed
// from its line to the key's; never the key itself. A request without a
// merchant (no API key) carries neither.
func TestKeyedPostsAccessLineNamesMerchantAndKeyHash(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	key := "access-key-" + uuid.NewString()
	for i, id := range []string{"keyed-first", "keyed-replay"} {
		req := f.request(http.MethodPost, "/v1/charges", key, chargeBody(acct, 10))
		req.Header.Set("X-Request-Id", id)
		if r := f.do(req); r.status != http.StatusCreated {
			t.Fatalf("charge %d: %d %s", i, r.status, r.body)
		}
	}
	anon := f.request(http.MethodPost, "/v1/charges", key, chargeBody(acct, 10))
	anon.Header.Del("Authorization")
	anon.Header.Set("X-Request-Id", "keyed-anonymous")
	f.do(anon)
	lines := map[string]map[string]any{}
	for _, line := range strings.Split(f.logs.String(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["msg"] == "request" {
			if id, _ := l["request_id"].(string); strings.HasPrefix(id, "keyed-") {
				lines[id] = l
			}
		}
		if strings.Contains(line, key) {
			t.Errorf("a log line holds the raw idempotency key: %s", line)
		}
	}
	merchant := f.merchantID.String()
	var hash any
	for _, id := range []string{"keyed-first", "keyed-replay"} {
		l := lines[id]
		if l["merchant_id"] != merchant || l["key_hash"] == nil || l["key_hash"] == "" {
			t.Errorf("%s's access line %v, want merchant_id %s and a key_hash", id, l, merchant)
		}
		if hash != nil && l["key_hash"] != hash {
			t.Errorf("the key's hash differs between its uses: %v, %v", hash, l["key_hash"])
		}
		hash = l["key_hash"]
	}
	if l := lines["keyed-anonymous"]; l == nil || l["merchant_id"] != nil || l["key_hash"] != nil {
		t.Errorf("the unauthenticated request's access line %v, want neither merchant nor key", l)
	}
}
