package httpapi_test

import (
	"crypto/rand"
	"encoding/base64"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"payments/internal/postgres"
)

// TestUnknownAPIKeysAreCheap floods the API with 200 bearer tokens that are no
// API key and counts the database connections they take: a token that cannot
// be a key takes none; well-formed unknown ones from one address are held to
// the failure budget. The merchant's own key, known before the flood, still
// works after it; a key not seen before waits for the budget to refill.
func TestUnknownAPIKeysAreCheap(t *testing.T) {
	f := setup(t)
	g := f.otherMerchant()
	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Fatalf("with the merchant's key: %d %s", r.status, r.body)
	}
	send := func(token string) {
		t.Helper()
		req := f.request(http.MethodGet, "/v1/charges", "", "")
		req.Header.Set("Authorization", "Bearer "+token)
		if r := f.do(req); r.status != http.StatusUnauthorized {
			t.Fatalf("token %q: %d %s, want 401", token, r.status, r.body)
		}
	}
	acquired := func() int64 { return f.store.Pool().Stat().AcquireCount() }

	const visible = "!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"
	before := acquired()
	for range 100 {
		token := make([]byte, 1+mrand.IntN(80))
		for i := range token {
			token[i] = visible[mrand.IntN(len(visible))]
		}
		send(string(token))
	}
	send("sk_" + base64.RawURLEncoding.EncodeToString(make([]byte, 33))) // too long
	send("pk_" + base64.RawURLEncoding.EncodeToString(make([]byte, 32))) // wrong prefix
	malformed := acquired() - before
	t.Logf("102 malformed tokens: %d database connections", malformed)
	if malformed != 0 {
		t.Errorf("102 malformed tokens took %d database connections, want 0", malformed)
	}

	before = acquired()
	began := time.Now()
	for range 100 {
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		send("sk_" + base64.RawURLEncoding.EncodeToString(secret))
	}
	elapsed := time.Since(began)
	wellFormed := acquired() - before
	bound := int64(postgres.UnknownKeyBurst + math.Ceil(elapsed.Seconds()*postgres.UnknownKeyRate))
	t.Logf("100 well-formed unknown keys in %s: %d database connections (bound %d)", elapsed.Round(time.Millisecond), wellFormed, bound)
	if wellFormed > bound {
		t.Errorf("100 well-formed unknown keys took %d database connections, want at most %d", wellFormed, bound)
	}

	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Errorf("the merchant's key after the flood: %d %s, want 200", r.status, r.body)
	}
	// The price: a key this process has not seen yet, from the flooding
	// address, waits for the budget to refill.
	if r := g.get("/v1/charges"); r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "too many unknown API keys") {
		t.Errorf("a new key from the flooding address: %d %s, want 401 too many unknown API keys", r.status, r.body)
	}
	time.Sleep(time.Duration(float64(time.Second) / postgres.UnknownKeyRate))
	if r := g.get("/v1/charges"); r.status != http.StatusOK {
		t.Errorf("a new key once the budget refilled: %d %s, want 200", r.status, r.body)
	}
}
