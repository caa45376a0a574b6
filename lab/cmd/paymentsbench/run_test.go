package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeService is an in-memory payments API, just enough for paymentsbench:
// accounts, deposits, idempotent charges and balances.
type fakeService struct {
	// doubleCharge is a bug to catch: a replayed 201 debits the account again.
	doubleCharge bool
	// inUseEvery makes every n-th charge request answer 409 in use without
	// executing, as a key held by another request would.
	inUseEvery int
	// heldKey is a key held in flight elsewhere: its charges answer 409 in use.
	heldKey string

	mu       sync.Mutex
	pending  map[string]bool // card charges answered 202, decided on the next request
	balances map[string]int64
	stored   map[string]storedAnswer // by Idempotency-Key
	requests int
	charges  int
}

type storedAnswer struct {
	status   int
	location string
	body     string
	debit    func()
}

func newFakeService(t *testing.T, f *fakeService) string {
	t.Helper()
	f.balances = map[string]int64{}
	f.stored = map[string]storedAnswer{}
	f.pending = map[string]bool{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /v1/accounts", f.idempotent(func(*http.Request) storedAnswer {
		id := fmt.Sprintf("acct_%d", len(f.balances))
		f.balances[id] = 0
		return storedAnswer{status: http.StatusCreated, location: "/v1/accounts/" + id, body: `{"id":"` + id + `"}`}
	}))
	mux.HandleFunc("POST /v1/accounts/{id}/deposits", f.idempotent(func(r *http.Request) storedAnswer {
		var in struct{ Amount int64 }
		_ = json.NewDecoder(r.Body).Decode(&in)
		f.balances[r.PathValue("id")] += in.Amount
		return storedAnswer{status: http.StatusCreated, body: `{}`}
	}))
	mux.HandleFunc("POST /v1/charges", f.idempotent(func(r *http.Request) storedAnswer {
		var in struct {
			AccountID     string `json:"account_id"`
			PaymentMethod string `json:"payment_method"`
			Amount        int64
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		if in.PaymentMethod != "" {
			return f.cardCharge(r.Header.Get("Idempotency-Key"), in.PaymentMethod)
		}
		if f.balances[in.AccountID] < in.Amount {
			return storedAnswer{status: http.StatusPaymentRequired, body: `{}`}
		}
		f.balances[in.AccountID] -= in.Amount
		f.charges++
		return storedAnswer{
			status: http.StatusCreated, location: fmt.Sprintf("/v1/charges/ch_%d", f.charges), body: `{}`,
			debit: func() { f.balances[in.AccountID] -= in.Amount },
		}
	}))
	mux.HandleFunc("GET /v1/accounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		fmt.Fprintf(w, `{"id":%q,"balance":%d}`, r.PathValue("id"), f.balances[r.PathValue("id")])
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk_test" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// cardCharge is a charge at the card processor, by test payment method:
// pm_card_decline is declined (402), pm_card_async answers 202 processing
// and succeeds on the next request with its key, any other succeeds (201).
func (f *fakeService) cardCharge(key, method string) storedAnswer {
	switch {
	case method == "pm_card_decline":
		return storedAnswer{status: http.StatusPaymentRequired, body: `{}`}
	case method == "pm_card_async" && !f.pending[key]:
		f.pending[key] = true
		return storedAnswer{status: http.StatusAccepted, body: `{"status":"processing"}`}
	}
	f.charges++
	return storedAnswer{status: http.StatusCreated, location: fmt.Sprintf("/v1/charges/ch_%d", f.charges), body: `{}`}
}

// idempotent runs op once per Idempotency-Key and replays its answer; a 202
// is not stored: the next request with the key asks again.
func (f *fakeService) idempotent(op func(*http.Request) storedAnswer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		f.requests++
		a, replay := f.stored[key]
		switch {
		case replay:
			w.Header().Set("Idempotent-Replayed", "true")
			if f.doubleCharge && a.debit != nil {
				a.debit()
			}
		case r.URL.Path == "/v1/charges" && (f.inUseEvery > 0 && f.requests%f.inUseEvery == 0 || f.heldKey != "" && key == f.heldKey):
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			return
		default:
			if a = op(r); a.status != http.StatusAccepted {
				f.stored[key] = a
			}
		}
		if a.location != "" {
			w.Header().Set("Location", a.location)
		}
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}
}

// bench runs paymentsbench against url with small settings plus args, and
// returns its JSON results by scenario.
func bench(t *testing.T, url string, args ...string) (map[string]result, error) {
	t.Helper()
	var out bytes.Buffer
	args = append([]string{"-url", url, "-json", "-c", "4", "-accounts", "5", "-balance", "100000",
		"-replay-keys", "10", "-storm-per-key", "8"}, args...)
	getenv := func(k string) string { return map[string]string{"PAYMENTS_API_KEY": "sk_test"}[k] }
	err := run(context.Background(), args, getenv, &out)
	results := map[string]result{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r result
		if jerr := json.Unmarshal(sc.Bytes(), &r); jerr != nil {
			t.Fatalf("output line %q is not JSON: %v", sc.Text(), jerr)
		}
		results[r.Scenario] = r
	}
	return results, err
}

func TestRunVerifiesEveryScenario(t *testing.T) {
	t.Parallel()
	f := &fakeService{inUseEvery: 7}
	results, err := bench(t, newFakeService(t, f), "-n", "200")
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, name := range scenarioNames {
		r, ok := results[name]
		if !ok {
			t.Fatalf("no result for scenario %s", name)
		}
		if !r.Verified || len(r.Mismatches) > 0 || r.Accounts != 5 || r.Requests != 200 {
			t.Errorf("%s: verified %t, %d accounts, %d requests, mismatches %q", name, r.Verified, r.Accounts, r.Requests, r.Mismatches)
		}
		if r.Statuses["201"]+r.InUse != r.Requests {
			t.Errorf("%s: statuses %v do not add up to %d requests", name, r.Statuses, r.Requests)
		}
	}
	if r := results["fresh"]; r.Replays != 0 || r.Charges != r.Statuses["201"] || r.Settled != int(r.InUse) || r.Succeeded != 200 {
		t.Errorf("fresh: %d charges, %d replays, %d in use, %d settled, %d succeeded; want every key charged once, the 409s settled",
			r.Charges, r.Replays, r.InUse, r.Settled, r.Succeeded)
	}
	if r := results["replay"]; r.Charges != 0 || r.Replays != r.Statuses["201"] || r.Keys != 10 {
		t.Errorf("replay: %d charges, %d replays of %d keys; want only replays of the 10 completed keys", r.Charges, r.Replays, r.Keys)
	}
	if r := results["storm"]; r.Keys != 200/8 {
		t.Errorf("storm: %d keys, want %d (one per 8 requests)", r.Keys, 200/8)
	}
	if r := results["mixed"]; r.Replays == 0 || r.Charges == 0 {
		t.Errorf("mixed: %d charges and %d replays, want both", r.Charges, r.Replays)
	}
}

func TestRunCardCharges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		method                        string
		created, processing, declined int64
		settled                       int
	}{
		{"pm_card_approve", 60, 0, 0, 0},
		{"pm_card_decline", 0, 0, 60, 0},
		{"pm_card_async", 0, 60, 0, 60},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			t.Parallel()
			f := &fakeService{}
			results, err := bench(t, newFakeService(t, f), "-n", "60", "-scenarios", "card", "-payment-method", tt.method)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			r := results["card"]
			if r.Statuses["201"] != tt.created || r.Processing != tt.processing || r.Declined != tt.declined ||
				r.ErrorCount != 0 || r.Settled != tt.settled {
				t.Errorf("statuses %v, %d processing, %d declined, %d errors, %d settled; want %d 201, %d 202, %d 402, no error, %d settled",
					r.Statuses, r.Processing, r.Declined, r.ErrorCount, r.Settled, tt.created, tt.processing, tt.declined, tt.settled)
			}
			if !r.Verified || r.Accounts != 0 || r.Keys != 60 {
				t.Errorf("verified %t (%q), %d accounts, %d keys; want 60 keys each with one final answer, no account",
					r.Verified, r.Mismatches, r.Accounts, r.Keys)
			}
			if tt.method != "pm_card_decline" && f.charges != 60 {
				t.Errorf("the service made %d charges, want 60: one per key", f.charges)
			}
			if len(f.balances) != 0 {
				t.Errorf("the card scenario opened %d accounts, want none", len(f.balances))
			}
		})
	}
}

func TestRunCatchesDoubleCharges(t *testing.T) {
	t.Parallel()
	f := &fakeService{doubleCharge: true}
	results, err := bench(t, newFakeService(t, f), "-n", "100", "-scenarios", "fresh,replay")
	if err == nil || !strings.Contains(err.Error(), "scenario replay") {
		t.Fatalf("run error = %v, want the replay scenario to fail verification", err)
	}
	if r := results["fresh"]; !r.Verified {
		t.Errorf("fresh sends every key once, so it should verify; got %q", r.Mismatches)
	}
	r := results["replay"]
	if r.Verified || len(r.Mismatches) == 0 || !strings.Contains(r.Mismatches[0], "want") {
		t.Errorf("replay: verified %t, mismatches %q; want the over-debited accounts listed", r.Verified, r.Mismatches)
	}
}

func TestRunForADuration(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	url := newFakeService(t, &fakeService{})
	args := []string{"-url", url, "-api-key", "sk_test", "-c", "2", "-d", "50ms", "-accounts", "3", "-scenarios", "storm", "-storm-interval", "10ms"}
	if err := run(context.Background(), args, func(string) string { return "" }, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "storm: 2 clients") || !strings.Contains(out.String(), "verified: ok") {
		t.Errorf("text output lacks the scenario or its verification:\n%s", out.String())
	}
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"no api key", nil, "", "-api-key"},
		{"bad url", []string{"-url", "localhost:8080"}, "sk", "-url"},
		{"unknown scenario", []string{"-scenarios", "fresh,boom"}, "sk", `unknown scenario "boom"`},
		{"no clients", []string{"-c", "0"}, "sk", "-c"},
		{"retry share", []string{"-mixed-retry", "1.5"}, "sk", "-mixed-retry"},
		{"amount", []string{"-amount", "100000000"}, "sk", "-amount"},
		{"payment method", []string{"-scenarios", "card", "-payment-method", `pm"x`}, "sk", "-payment-method"},
		{"held key on a card", []string{"-scenarios", "card", "-held-key", "k"}, "sk", "-held-key"},
		{"processor pid", []string{"-processor-pid", "-1"}, "sk", "-processor-pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			_, err := parseConfig(tt.args, func(string) string { return tt.env }, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseConfig(%q) error = %v, want it to mention %q", tt.args, err, tt.want)
			}
		})
	}
}
