package httpapi_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/httpapi"
)

// A merchant over its budget of writes waits for its turn up to the
// budget's wait, and past it is answered 429 rate-limited, after the wait,
// before its request is read: no charge, no key, no money moved, and a
// retry with the same key after Retry-After runs it once. Another merchant
// on the same replica is not refused meanwhile.
func TestWritesOverTheBudgetChangeNothing(t *testing.T) {
	const perSecond, amount, wait = 10, 100, 300 * time.Millisecond
	f := setup(t, func(o *setupOptions) { o.budget = httpapi.MerchantBudget{Writes: perSecond, Wait: wait} })
	other := f.otherMerchant()
	account := f.account("USD", 100_000) // two writes of the burst of 10
	time.Sleep(time.Second)              // the burst is whole again

	const n = 40
	keys := make([]string, n)
	reqs := make([]*http.Request, n)
	for i := range reqs {
		keys[i] = uuid.NewString()
		reqs[i] = f.request(http.MethodPost, "/v1/charges", keys[i], chargeBody(account, amount))
	}
	replies := f.postAll(10*time.Second, reqs)

	var created int
	var limitedKey string
	for i, r := range replies {
		if r.err != nil {
			t.Fatalf("charge %d: %v", i, r.err)
		}
		checkContract(t, reqs[i], &http.Response{StatusCode: r.status, Header: r.header, Request: reqs[i]}, r.body)
		switch r.status {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			if c := r.code(t); c != "rate-limited" {
				t.Fatalf("charge %d: 429 %q, want rate-limited", i, c)
			}
			if r.took < wait {
				t.Errorf("charge %d: refused after %s, before the wait (%s)", i, r.took, wait)
			}
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("charge %d: Retry-After %q, want whole seconds, at least 1", i, r.header.Get("Retry-After"))
			}
			if !strings.Contains(string(r.body), "10 writes a second") {
				t.Errorf("charge %d: the detail does not name the budget: %s", i, r.body)
			}
			limitedKey = keys[i]
		default:
			t.Fatalf("charge %d: %d %s, want 201 or 429", i, r.status, r.body)
		}
	}
	// The burst (10), the 3 whose turn came within the wait, and what
	// refilled while the 40 were sent.
	if created < perSecond || created > perSecond+3+2 || limitedKey == "" {
		t.Fatalf("%d of %d charges created, want %d to %d, the rest refused", created, n, perSecond, perSecond+3+2)
	}
	if got := f.charges(); got != created {
		t.Errorf("%d charges stored, %d answered 201: a refused request left a charge", got, created)
	}
	if got := f.keys(); got != created+2 { // the account's and the deposit's keys
		t.Errorf("%d keys stored, want %d: a refused request claimed its key", got, created+2)
	}
	if got, want := f.balance(account), int64(100_000-created*amount); got != want {
		t.Errorf("balance %d, want %d", got, want)
	}
	if !strings.Contains(f.scrape(), `payments_rate_limited_total{kind="writes"} `+strconv.Itoa(n-created)) {
		t.Errorf("payments_rate_limited_total{kind=\"writes\"} is not %d", n-created)
	}

	// Another merchant spends a budget of its own.
	if r := other.post("/v1/accounts", uuid.NewString(), `{"currency":"USD"}`); r.status != http.StatusCreated {
		t.Errorf("another merchant, while the first is over its budget: %d %s", r.status, r.body)
	}

	// The refused key was never claimed: once the budget refills, it runs.
	time.Sleep(time.Second)
	r := f.post("/v1/charges", limitedKey, chargeBody(account, amount))
	if r.status != http.StatusCreated {
		t.Fatalf("the refused key, retried after Retry-After: %d %s", r.status, r.body)
	}
	if got := f.charges(); got != created+1 {
		t.Errorf("%d charges after the retry, want %d", got, created+1)
	}
	f.checkLedger(account)
}

// Reads have a budget of their own: a merchant polling past it is refused
// reads, not charges, and another merchant's reads are not refused.
func TestReadsHaveABudgetOfTheirOwn(t *testing.T) {
	const perSecond = 5
	f := setup(t, func(o *setupOptions) {
		o.budget = httpapi.MerchantBudget{Reads: perSecond, Writes: 1000, Wait: 100 * time.Millisecond}
	})
	other := f.otherMerchant()
	account := f.account("USD", 10_000)

	const n = 30
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = f.request(http.MethodGet, "/v1/accounts/"+account, "", "")
	}
	var ok, limited int
	for i, r := range f.postAll(10*time.Second, reqs) {
		switch {
		case r.err != nil:
			t.Fatalf("read %d: %v", i, r.err)
		case r.status == http.StatusOK:
			ok++
		case r.status == http.StatusTooManyRequests && r.code(t) == "rate-limited":
			limited++
		default:
			t.Fatalf("read %d: %d %s", i, r.status, r.body)
		}
	}
	// The burst (5), their turns within the wait (0.5) and the refill.
	if ok < perSecond || ok > perSecond+2 || limited != n-ok {
		t.Fatalf("%d reads answered, %d refused: want %d to %d answered, the rest refused", ok, limited, perSecond, perSecond+2)
	}
	// Its writes are not spent by its reads.
	if r := f.post("/v1/charges", uuid.NewString(), chargeBody(account, 100)); r.status != http.StatusCreated {
		t.Errorf("a charge while reads are over their budget: %d %s", r.status, r.body)
	}
	if r := other.get("/v1/charges"); r.status != http.StatusOK {
		t.Errorf("another merchant's read: %d %s", r.status, r.body)
	}
	if !strings.Contains(f.scrape(), `payments_rate_limited_total{kind="reads"} `+strconv.Itoa(limited)) {
		t.Errorf("payments_rate_limited_total{kind=\"reads\"} is not %d", limited)
	}
}
