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

	"github.com/exactlyonce/payments/internal/postgres"
)

// TestUnknownAPIKeysAreCheap floods the API, 20 clients at once, with 202
// bearer tokens that are no API key and counts the database connections they
// take: a token that cannot be a key takes none; well-formed unknown ones from
// one address are held to the failure budget. The merchant's own key, known
// before the flood, still works after it; a key not seen before waits for the
// budget to refill.
func TestUnknownAPIKeysAreCheap(t *testing.T) {
	f := setup(t)
	g := f.otherMerchant()
	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Fatalf("with the merchant's key: %d %s", r.status, r.body)
	}
	// flood sends tokens from 20 clients at once and checks every answer is 401.
	flood := func(tokens []string) {
		t.Helper()
		statuses := make(chan string, len(tokens))
		work := make(chan string)
		for range 20 {
			go func() {
				for token := range work {
					req := f.request(http.MethodGet, "/v1/charges", "", "")
					req.Header.Set("Authorization", "Bearer "+token)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						statuses <- err.Error()
						continue
					}
					resp.Body.Close()
					statuses <- resp.Status
				}
			}()
		}
		for _, token := range tokens {
			work <- token
		}
		close(work)
		for range tokens {
			if s := <-statuses; s != "401 Unauthorized" {
				t.Errorf("a random token: %s, want 401", s)
			}
		}
	}
	acquired := func() int64 { return f.store.Pool().Stat().AcquireCount() }

	const visible = "!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"
	var malformed []string
	for range 100 {
		token := make([]byte, 1+mrand.IntN(80))
		for i := range token {
			token[i] = visible[mrand.IntN(len(visible))]
		}
		malformed = append(malformed, string(token))
	}
	malformed = append(malformed,
		"sk_"+base64.RawURLEncoding.EncodeToString(make([]byte, 33)), // too long
		"pk_"+base64.RawURLEncoding.EncodeToString(make([]byte, 32))) // wrong prefix
	before := acquired()
	flood(malformed)
	if n := acquired() - before; n != 0 {
		t.Errorf("%d malformed tokens took %d database connections, want 0", len(malformed), n)
	} else {
		t.Logf("%d malformed tokens: 0 database connections", len(malformed))
	}

	var wellFormed []string
	for range 100 {
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		wellFormed = append(wellFormed, "sk_"+base64.RawURLEncoding.EncodeToString(secret))
	}
	before = acquired()
	began := time.Now()
	flood(wellFormed)
	elapsed := time.Since(began)
	n := acquired() - before
	bound := int64(postgres.UnknownKeyBurst + math.Ceil(elapsed.Seconds()*postgres.UnknownKeyRate) + postgres.UnknownKeyLookups - 1)
	t.Logf("%d well-formed unknown keys in %s: %d database connections (bound %d)", len(wellFormed), elapsed.Round(time.Millisecond), n, bound)
	if n > bound {
		t.Errorf("%d well-formed unknown keys took %d database connections, want at most %d", len(wellFormed), n, bound)
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
