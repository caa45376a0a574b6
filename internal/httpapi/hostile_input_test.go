package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// TestResponsesAreNotHTMLEscaped: <, > and & are rendered as sent, not as
// six-byte escapes, so a response is no larger than what it echoes; it is
// stored and replayed byte for byte, on the charge batch and the general path;
// and a response stored escaped (by an older version) replays as stored.
func TestResponsesAreNotHTMLEscaped(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.cacheSize = 0 }) // replays come from the table

	// The attack: an account whose every free-form byte is '<'.
	var meta []string
	for i := range 50 {
		meta = append(meta, fmt.Sprintf(`"k%02d":"%s"`, i, strings.Repeat("<", 500)))
	}
	big := `{"currency":"USD","description":"` + strings.Repeat("<", 1000) + `","metadata":{` + strings.Join(meta, ",") + `}}`
	r := f.post("/v1/accounts", uuid.NewString(), big)
	if r.status != http.StatusCreated || bytes.Contains(r.body, []byte(`\u003c`)) {
		t.Fatalf("create account: %d, escaped: %v", r.status, bytes.Contains(r.body, []byte(`\u003c`)))
	}
	t.Logf("a %d-byte request of '<' made a %d-byte response (HTML-escaped it was %d)",
		len(big), len(r.body), len(r.body)+5*strings.Count(string(r.body), "<"))
	if len(r.body) > len(big)+1024 {
		t.Errorf("a %d-byte request made a %d-byte response", len(big), len(r.body))
	}

	const text = `<b>&amp;</b> & "q" > 1`
	const rendered = `"description":"<b>&amp;</b> & \"q\" > 1"`
	accountKey := uuid.NewString()
	account := f.post("/v1/accounts", accountKey, `{"currency":"USD","description":"`+strings.ReplaceAll(text, `"`, `\"`)+`"}`)
	if account.status != http.StatusCreated || !bytes.Contains(account.body, []byte(rendered)) {
		t.Fatalf("create account: %d %s; want %s in it", account.status, account.body, rendered)
	}
	acct := account.json(t)["id"].(string)
	f.post("/v1/accounts/"+acct+"/deposits", uuid.NewString(), `{"amount":1000}`)
	chargeKey := uuid.NewString()
	chargeReq := `{"account_id":"` + acct + `","amount":10,"currency":"USD","description":"` + strings.ReplaceAll(text, `"`, `\"`) + `"}`
	charge := f.post("/v1/charges", chargeKey, chargeReq)
	if charge.status != http.StatusCreated || !bytes.Contains(charge.body, []byte(rendered)) {
		t.Fatalf("charge: %d %s; want %s in it", charge.status, charge.body, rendered)
	}
	for _, c := range []struct {
		path, key, body string
		first           reply
	}{
		{"/v1/accounts", accountKey, `{"currency":"USD","description":"` + strings.ReplaceAll(text, `"`, `\"`) + `"}`, account},
		{"/v1/charges", chargeKey, chargeReq, charge},
	} {
		if _, stored := f.storedResponse(c.key); !bytes.Equal(stored, c.first.body) {
			t.Errorf("%s: stored %s, answered %s", c.path, stored, c.first.body)
		}
		again := f.post(c.path, c.key, c.body)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, c.first.body) {
			t.Errorf("%s: replay %s, want byte for byte %s", c.path, again.body, c.first.body)
		}
	}
	if got := f.get("/v1/charges/" + charge.json(t)["id"].(string)); !bytes.Contains(got.body, []byte(rendered)) {
		t.Errorf("GET the charge: %s; want %s in it", got.body, rendered)
	}

	// A response stored HTML-escaped replays exactly as it was stored.
	escaped := bytes.ReplaceAll(bytes.ReplaceAll(bytes.ReplaceAll(charge.body,
		[]byte("&"), []byte(`\u0026`)), []byte("<"), []byte(`\u003c`)), []byte(">"), []byte(`\u003e`))
	if _, err := f.db.Exec(context.Background(), `UPDATE idempotency_keys SET body = $3, body_encoding = NULL
		WHERE merchant_id = $1 AND key = $2`, f.merchantID, chargeKey, escaped); err != nil {
		t.Fatal(err)
	}
	if again := f.post("/v1/charges", chargeKey, chargeReq); !bytes.Equal(again.body, escaped) {
		t.Errorf("replay of an escaped response: %s, want %s", again.body, escaped)
	}
	if f.charges() != 1 {
		t.Errorf("%d charges, want 1", f.charges())
	}
}

// TestPercentEncodedPathIsRefusedBeforeTheKey reproduces a lost deposit
// found in an adversarial review: a path sent as /v1/accounts/%61cct_…/deposits was routed by its raw
// form (no such account: a stored 404) but fingerprinted by its decoded form,
// so the same deposit on the plain path replayed that 404. Such a path is now
// a 400 that claims no key, and the plain path then deposits.
func TestPercentEncodedPathIsRefusedBeforeTheKey(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.cacheSize = 0 })
	acct := f.account("USD", 0)
	key := uuid.NewString()
	for _, path := range []string{
		"/v1/accounts/%61" + acct[1:] + "/deposits",
		"/v1/accounts/" + acct + "%2Fdeposits",
		"/v1/%61ccounts/" + acct + "/deposits",
	} {
		r := f.post(path, key, `{"amount":500}`)
		if r.status != http.StatusBadRequest || r.code(t) != "invalid-request" {
			t.Errorf("POST %s: %d %s, want 400 invalid-request", path, r.status, r.body)
		}
	}
	if n := f.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`, key); n != 0 {
		t.Errorf("the refused requests claimed the key (%d rows)", n)
	}
	r := f.post("/v1/accounts/"+acct+"/deposits", key, `{"amount":500}`)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || f.balance(acct) != 500 {
		t.Errorf("the plain path: %d %s, balance %d; want a new 201 and 500", r.status, r.body, f.balance(acct))
	}
	// A space is sent in its one canonical encoding, %20: routed and
	// fingerprinted alike (no such account, stored as a 404).
	if r := f.post("/v1/accounts/acct%20x/deposits", uuid.NewString(), `{"amount":500}`); r.status != http.StatusNotFound {
		t.Errorf("POST with %%20: %d %s, want 404", r.status, r.body)
	}
}

// TestTwoAuthorizationHeadersAreRefused: with two Authorization headers the
// first used to win; which one a client or proxy meant is a guess, so the
// request is a 401 problem, whichever order the valid key comes in.
func TestTwoAuthorizationHeadersAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, headers := range [][]string{
		{"Bearer " + f.apiKey, "Bearer sk_other"},
		{"Bearer sk_other", "Bearer " + f.apiKey},
		{"Bearer " + f.apiKey, "Bearer " + f.apiKey},
	} {
		req := f.request(http.MethodPost, "/v1/accounts", uuid.NewString(), `{"currency":"USD"}`)
		req.Header["Authorization"] = headers
		r := f.do(req)
		if r.status != http.StatusUnauthorized || r.code(t) != "unauthorized" || !strings.Contains(r.json(t)["detail"].(string), "exactly one") {
			t.Errorf("%d Authorization headers: %d %s, want 401 unauthorized", len(headers), r.status, r.body)
		}
		get := f.request(http.MethodGet, "/v1/charges", "", "")
		get.Header["Authorization"] = headers
		if r := f.do(get); r.status != http.StatusUnauthorized {
			t.Errorf("GET with two Authorization headers: %d %s, want 401", r.status, r.body)
		}
	}
	if n := f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1`); n != 0 {
		t.Errorf("%d accounts created", n)
	}
}

// TestNestedMetadataNamesTheMember: a metadata value that is not a string is
// reported by its member, metadata.k, not as "metadata must be a string".
func TestNestedMetadataNamesTheMember(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for body, want := range map[string]string{
		`{"currency":"USD","metadata":{"k":{"x":1}}}`:          "metadata.k must be a string, got object",
		`{"currency":"USD","metadata":{"a":"1","b.c":[2]}}`:    "metadata.b.c must be a string, got array",
		`{"currency":"USD","metadata":{"a":"1","n":5,"o":{}}}`: "metadata.n must be a string, got number",
		`{"currency":"USD","metadata":"flat"}`:                 "metadata must be an object of string values, got string",
		`{"currency":"USD","metadata":{"<k>":{"x":1}}}`:        "metadata.<k> must be a string, got object",
	} {
		r := f.post("/v1/accounts", uuid.NewString(), body)
		p := r.json(t)
		if r.status != http.StatusBadRequest || p["detail"] != want || !strings.HasPrefix(want, p["field"].(string)+" ") {
			t.Errorf("%s: %d %s, want 400 with detail %q", body, r.status, r.body, want)
		}
	}
}
