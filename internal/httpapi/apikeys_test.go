package httpapi_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/postgres"
)

// madeUpKey returns a well-formed API key that no merchant holds.
func madeUpKey() string {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	return "sk_" + base64.RawURLEncoding.EncodeToString(secret)
}

// withKey sends GET /v1/charges with apiKey (and X-Forwarded-For xff, if
// set) and returns the status and the Retry-After header; the exchange is
// held to openapi.yaml. Any goroutine may call it.
func (f *fixture) withKey(apiKey, xff string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, f.url+"/v1/charges", nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	checkContract(f.t, req, resp, body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), nil
}

// newKeyOutside creates a merchant through a store of its own, as the
// operator's command does, so that the API's store has never seen its key
// (nor counts the connection), and returns the key.
func (f *fixture) newKeyOutside(name string) string {
	f.t.Helper()
	admin, err := postgres.Open(context.Background(), f.store.Pool().Config().ConnString(), postgres.Options{MaxConns: 2})
	if err != nil {
		f.t.Fatal(err)
	}
	defer admin.Close()
	_, key, err := admin.RegisterMerchant(context.Background(), f.t.Name()+"-"+name)
	if err != nil {
		f.t.Fatal(err)
	}
	return key.Secret
}

// acquired counts the connections the API's store has taken: one per key
// lookup, one per read.
func (f *fixture) acquired() int64 { return f.store.Pool().Stat().AcquireCount() }

// TestUnknownKeyFloodSparesNewKeys is a flood of unknown keys beside honest
// ones behind the same address (a proxy or a NAT): from one address, a
// client sends 50 unknown API keys a second (most made up afresh, some sent
// again and again, as a client stuck on a revoked key does) for 3 s, while
// three keys the service has never seen, of merchants created by the
// operator's store, are each used once from the same address, 0.5, 1.5 and
// 2.5 s in: each succeeds at its first try. The flood is answered 401
// throughout, never 429, and costs at most one lookup per distinct key.
func TestUnknownKeyFloodSparesNewKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	fresh := []string{f.newKeyOutside("a"), f.newKeyOutside("b"), f.newKeyOutside("c")}
	repeated := []string{madeUpKey(), madeUpKey(), madeUpKey()}
	var (
		mu       sync.Mutex
		distinct = map[string]bool{}
		statuses = map[int]int{}
		answered = make([]int, len(fresh))
		wg       sync.WaitGroup
	)
	send := func(key string, into func(int)) {
		wg.Go(func() {
			status, _, err := f.withKey(key, "")
			if err != nil {
				t.Errorf("GET /v1/charges: %v", err)
				return
			}
			mu.Lock()
			into(status)
			mu.Unlock()
		})
	}
	before := f.acquired()
	tick := time.NewTicker(20 * time.Millisecond) // 50 a second
	defer tick.Stop()
	began := time.Now()
	next := 0 // the next fresh key to use
	for time.Since(began) < 3*time.Second {
		<-tick.C
		key := madeUpKey()
		if mrand.IntN(3) == 0 {
			key = repeated[mrand.IntN(len(repeated))]
		}
		distinct[key] = true
		send(key, func(status int) { statuses[status]++ })
		if next < len(fresh) && time.Since(began) >= time.Duration(2*next+1)*500*time.Millisecond {
			i := next
			send(fresh[i], func(status int) { answered[i] = status })
			next++
		}
	}
	wg.Wait()
	for i, status := range answered {
		if status != http.StatusOK {
			t.Errorf("valid never-seen key %d, its first use during the flood: %d, want 200", i+1, status)
		}
	}
	n := 0
	for status, count := range statuses {
		n += count
		if status != http.StatusUnauthorized {
			t.Errorf("%d unknown keys answered %d, want 401", count, status)
		}
	}
	taken := f.acquired() - before
	t.Logf("%d unknown keys in %s (%d distinct): statuses %v; the valid keys: %v; %d connections taken",
		n, time.Since(began).Round(time.Millisecond), len(distinct), statuses, answered, taken)
	// A valid key's last use is written by a connection of its own, after
	// its request (internal/postgres/keyuse.go): once per valid key at most.
	// Its read may wait for a confirmation round, which takes a connection
	// of its own too (internal/postgres/confirmed.go): one per read at most.
	if bound := int64(len(distinct) + 4*len(fresh)); taken > bound {
		t.Errorf("%d connections taken, want at most %d: a lookup per distinct key; a lookup, a read, "+
			"a confirmation round and the write of its last use per valid key", taken, bound)
	}
}

// TestUnknownAPIKeysAreCheap floods the API, 20 clients at once, with bearer
// tokens that are no API key, then with 100 well-formed unknown keys twice,
// and counts the database connections: a token that cannot be a key takes
// none, an unknown key one lookup the first time and none after. The
// merchant's own key, and a key not seen before, from the same address, are
// answered at once.
func TestUnknownAPIKeysAreCheap(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Fatalf("with the merchant's key: %d %s", r.status, r.body)
	}
	// That use of the key is written off the request path, on a connection
	// of its own (internal/postgres/keyuse.go): wait for it, so that it is
	// not counted against the flood below.
	for deadline := time.Now().Add(10 * time.Second); f.count(`SELECT count(*) FROM api_keys WHERE merchant_id = $1 AND last_used_at IS NOT NULL`) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the merchant key's use was not written within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// flood sends tokens from 20 clients at once and checks every answer is 401.
	flood := func(tokens []string) {
		t.Helper()
		work := make(chan string)
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				for token := range work {
					if status, _, err := f.withKey(token, ""); err != nil || status != http.StatusUnauthorized {
						t.Errorf("a random token: %d %v, want 401", status, err)
					}
				}
			})
		}
		for _, token := range tokens {
			work <- token
		}
		close(work)
		wg.Wait()
	}

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
	before := f.acquired()
	flood(malformed)
	if n := f.acquired() - before; n != 0 {
		t.Fatalf("%d malformed tokens took %d database connections, want 0", len(malformed), n)
	}

	var wellFormed []string
	for range 100 {
		wellFormed = append(wellFormed, madeUpKey())
	}
	before = f.acquired()
	flood(wellFormed)
	first := f.acquired() - before
	if first > int64(len(wellFormed)) {
		t.Errorf("%d well-formed unknown keys took %d database connections, want at most one each", len(wellFormed), first)
	}
	before = f.acquired()
	flood(wellFormed)
	again := f.acquired() - before
	if again != 0 {
		t.Errorf("the same %d unknown keys again took %d database connections, want 0", len(wellFormed), again)
	}
	t.Logf("%d malformed tokens: 0 database connections; %d well-formed unknown keys: %d, and %d when sent again",
		len(malformed), len(wellFormed), first, again)

	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Errorf("the merchant's key after the flood: %d %s, want 200", r.status, r.body)
	}
	if status, _, err := f.withKey(f.newKeyOutside("new"), ""); err != nil || status != http.StatusOK {
		t.Errorf("a new key from the flooding address: %d %v, want 200", status, err)
	}
}

// TestNewKeyPastTheWaitBound: when an address has spent its budget and the
// next token is further away than the wait bound, a key the service has not
// seen is answered 429 too-many-unknown-keys with a Retry-After of when the
// token comes, not 401: it was not checked. A key already found valid, from
// the same address, is answered 200.
func TestNewKeyPastTheWaitBound(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) {
		o.keyBudget = postgres.KeyBudget{Burst: 1, Rate: 0.1, Wait: 500 * time.Millisecond}
	})
	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Fatalf("with the merchant's key: %d %s", r.status, r.body)
	}
	if status, _, err := f.withKey(madeUpKey(), ""); err != nil || status != http.StatusUnauthorized {
		t.Fatalf("a made-up key: %d %v, want 401", status, err)
	}
	fresh := f.newKeyOutside("fresh")
	req := f.request(http.MethodGet, "/v1/charges", "", "")
	req.Header.Set("Authorization", "Bearer "+fresh)
	r := f.do(req)
	retry, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != http.StatusTooManyRequests || r.code(t) != "too-many-unknown-keys" || err != nil || retry < 1 || retry > 10 {
		t.Errorf("a new key, the next token 10 s away: %d %s, Retry-After %q; want 429 too-many-unknown-keys, Retry-After 1 to 10",
			r.status, r.body, r.header.Get("Retry-After"))
	}
	if r := f.get("/v1/charges"); r.status != http.StatusOK {
		t.Errorf("the merchant's key, found valid before: %d %s, want 200", r.status, r.body)
	}
}

// TestTrustedProxies: behind a trusted proxy (TRUSTED_PROXIES), the budget
// is the client's that X-Forwarded-For names: one client spending its budget
// does not hold up another's new key. From a peer not trusted the header is
// ignored, so both share the peer's budget.
func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	budget := postgres.KeyBudget{Burst: 1, Rate: 0.1, Wait: 300 * time.Millisecond}
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		want    int // the other client's new key
	}{
		{"behind a trusted proxy", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, http.StatusOK},
		{"from a peer not trusted", nil, http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, func(o *setupOptions) { o.keyBudget, o.trustedProxies = budget, tc.trusted })
			// The client writes an address of its own choosing on the left;
			// the proxy appends the one it saw.
			if status, _, err := f.withKey(madeUpKey(), "198.51.100.1, 203.0.113.7"); err != nil || status != http.StatusUnauthorized {
				t.Fatalf("a made-up key from 203.0.113.7: %d %v, want 401", status, err)
			}
			if status, _, err := f.withKey(f.newKeyOutside("other"), "203.0.113.8"); err != nil || status != tc.want {
				t.Errorf("a new key from 203.0.113.8: %d %v, want %d", status, err, tc.want)
			}
			if tc.trusted == nil {
				return
			}
			// The same client, writing another address on the left: the
			// budget is still 203.0.113.7's, the rightmost not trusted.
			if status, _, err := f.withKey(f.newKeyOutside("same"), "192.0.2.99, 203.0.113.7"); err != nil || status != http.StatusTooManyRequests {
				t.Errorf("a new key from 203.0.113.7 again: %d %v, want 429 (its budget is spent)", status, err)
			}
		})
	}
}
