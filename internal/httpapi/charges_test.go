package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

func TestChargeThenReplayIsByteForByte(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	key := uuid.NewString()

	first := f.post("/v1/charges", key, chargeBody(acct, 300))
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.status, first.body)
	}
	ch := first.json(t)
	if ch["status"] != "succeeded" || ch["amount"] != float64(300) || ch["amount_refunded"] != float64(0) {
		t.Errorf("charge body = %s", first.body)
	}
	loc := first.header.Get("Location")
	if loc != "/v1/charges/"+ch["id"].(string) {
		t.Errorf("Location = %q, want the charge's URL", loc)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Error("a first execution is marked as replayed")
	}

	// A retry, with members reordered and whitespace added: the same request.
	retryBody := "{ \"currency\": \"USD\",\n  \"amount\": 300, \"account_id\": \"" + acct + "\" }"
	for i := range 3 {
		again := f.post("/v1/charges", key, retryBody)
		if again.status != first.status || !bytes.Equal(again.body, first.body) {
			t.Fatalf("retry %d: %d %s, want byte-identical %d %s", i, again.status, again.body, first.status, first.body)
		}
		if again.header.Get("Location") != loc || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry %d: Location %q, Idempotent-Replayed %q", i, again.header.Get("Location"), again.header.Get("Idempotent-Replayed"))
		}
	}

	if got := f.balance(acct); got != 700 {
		t.Errorf("balance = %d, want 700 (charged once)", got)
	}
	if n := f.charges(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	f.checkLedger(acct)

	got := f.get(loc)
	if got.status != http.StatusOK || !bytes.Equal(got.body, first.body) {
		t.Errorf("GET %s = %d %s, want the created charge %s", loc, got.status, got.body, first.body)
	}
	if !strings.Contains(f.logs.String(), `"outcome":"replayed"`) {
		t.Error("no audit line for the replays")
	}
	if strings.Contains(f.logs.String(), key) || strings.Contains(f.logs.String(), f.apiKey) {
		t.Error("a raw idempotency key or API key was logged")
	}
}

// TestReplaysComeFromTheCache: the server answers a retry from the response
// cache of the front it was given, byte for byte, without the database.
func TestReplaysComeFromTheCache(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	key := uuid.NewString()
	first := f.post("/v1/charges", key, chargeBody(acct, 100))
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.status, first.body)
	}
	hits, _ := f.front.Cache().Stats()
	again := f.post("/v1/charges", key, chargeBody(acct, 100))
	if !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s, want the replay of %s", again.status, again.body, first.body)
	}
	if now, _ := f.front.Cache().Stats(); now != hits+1 {
		t.Errorf("the cache counted %d hits for the retry, want 1", now-hits)
	}
	if f.charges() != 1 || f.balance(acct) != 900 {
		t.Errorf("%d charges, balance %d; want 1 and 900", f.charges(), f.balance(acct))
	}
}

func TestKeyReusedForAnotherRequestIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	key := uuid.NewString()
	first := f.post("/v1/charges", key, chargeBody(acct, 100))
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.status, first.body)
	}

	cases := []struct {
		name, path, body string
	}{
		{"other amount", "/v1/charges", chargeBody(acct, 101)},
		{"extra description", "/v1/charges", `{"account_id":"` + acct + `","amount":100,"currency":"USD","description":"x"}`},
		{"other route", "/v1/accounts/" + acct + "/deposits", `{"amount":100}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := f.post(tc.path, key, tc.body)
			if r.status != http.StatusUnprocessableEntity || r.code(t) != "idempotency-key-reused" {
				t.Fatalf("got %d %s, want 422 idempotency-key-reused", r.status, r.body)
			}
		})
	}
	if got := f.balance(acct); got != 900 {
		t.Errorf("balance = %d, want 900: a refused reuse must execute nothing", got)
	}
	if n := f.charges(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
	if !strings.Contains(f.logs.String(), `"outcome":"mismatch"`) {
		t.Error("no audit line for the mismatch")
	}
}

// TestBusinessRefusalsAreStoredAndReplayed: a 402, a 404 and a 422 decided
// after the key was claimed are stored and replayed even once the account
// would allow the request. What is stored is read where it is stored, the
// key's row, and the replays come from there too: the response cache is off.
func TestBusinessRefusalsAreStoredAndReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.cacheSize = 0 })
	usd := f.account("USD", 100)
	eur := f.account("EUR", 100)
	unknown := "acct_" + strings.Repeat("1", 32)

	cases := []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"insufficient funds", chargeBody(usd, 500), http.StatusPaymentRequired, "insufficient-funds"},
		{"unknown account", chargeBody(unknown, 50), http.StatusNotFound, "account-not-found"},
		{"currency mismatch", chargeBody(eur, 50), http.StatusUnprocessableEntity, "currency-mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := uuid.NewString()
			first := f.post("/v1/charges", key, tc.body)
			if first.status != tc.status || first.code(t) != tc.code {
				t.Fatalf("got %d %s, want %d %s", first.status, first.body, tc.status, tc.code)
			}
			if status, body := f.storedResponse(key); status != first.status || !bytes.Equal(body, first.body) {
				t.Fatalf("the key's row holds %d %s, want the answer %d %s", status, body, first.status, first.body)
			}
			// Fund the accounts generously: the stored refusal is still the answer.
			f.post("/v1/accounts/"+usd+"/deposits", uuid.NewString(), `{"amount":10000}`)
			again := f.post("/v1/charges", key, tc.body)
			if again.status != first.status || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay = %d %s, want the stored %d %s", again.status, again.body, first.status, first.body)
			}
		})
	}

	// The 402 recorded one failed charge and moved no money.
	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'failed' AND failure_code = 'insufficient-funds'`); n != 1 {
		t.Errorf("%d failed charges, want 1", n)
	}
	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'succeeded'`); n != 0 {
		t.Errorf("%d succeeded charges, want 0", n)
	}
	if got := f.balance(usd); got != 100+3*10000 {
		t.Errorf("USD balance = %d, want %d", got, 100+3*10000)
	}
	if got := f.balance(eur); got != 100 {
		t.Errorf("EUR balance = %d, want 100", got)
	}
	f.checkLedger(usd)
}

func TestFailedChargeProblemNamesTheCharge(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 10)
	r := f.post("/v1/charges", uuid.NewString(), chargeBody(acct, 11))
	if r.status != http.StatusPaymentRequired {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	id, _ := r.json(t)["charge_id"].(string)
	got := f.get("/v1/charges/" + id)
	if got.status != http.StatusOK {
		t.Fatalf("GET failed charge: %d %s", got.status, got.body)
	}
	// One spelling: the charge's failure_code is the problem's code.
	if c := got.json(t); c["status"] != "failed" || c["failure_code"] != "insufficient-funds" || c["failure_code"] != r.code(t) {
		t.Errorf("failed charge = %s, refused with the problem %s", got.body, r.body)
	}
	// So is the charge in its charge.failed event.
	_, events := f.list("/v1/events?limit=100")
	var failed int
	for _, e := range events {
		if e.Type == "charge.failed" {
			failed++
			var c map[string]any
			if err := json.Unmarshal(e.Data, &c); err != nil || c["id"] != id || c["failure_code"] != r.code(t) {
				t.Errorf("charge.failed event data = %s, want the charge %s with failure_code %s (%v)", e.Data, id, r.code(t), err)
			}
		}
	}
	if failed > 1 {
		t.Errorf("%d charge.failed events, want at most 1", failed)
	}
}

// TestConcurrentRetriesOfOneKeyChargeOnce releases many identical requests at
// once: one executes, the others wait for it and replay its answer.
func TestConcurrentRetriesOfOneKeyChargeOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 10_000)
	key := uuid.NewString()
	body := chargeBody(acct, 2500)

	const n = 60
	replies := make([]reply, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req := f.request(http.MethodPost, "/v1/charges", key, body)
			<-start
			replies[i] = f.do(req)
		})
	}
	close(start)
	wg.Wait()

	var created []reply
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			created = append(created, r)
		case http.StatusConflict:
			if r.code(t) != "idempotency-key-in-use" || r.header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After or with the wrong code: %v %s", r.header, r.body)
			}
		default:
			t.Errorf("unexpected reply %d %s", r.status, r.body)
		}
	}
	if len(created) == 0 {
		t.Fatal("no request succeeded")
	}
	fresh := 0
	for _, r := range created {
		if !bytes.Equal(r.body, created[0].body) {
			t.Errorf("201 bodies differ:\n%s\n%s", r.body, created[0].body)
		}
		if r.header.Get("Idempotent-Replayed") != "true" {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d executions, want exactly 1", fresh)
	}
	if n := f.charges(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	if got := f.balance(acct); got != 7500 {
		t.Errorf("balance = %d, want 7500 (debited once)", got)
	}
	f.checkLedger(acct)
}

// TestConcurrentDistinctChargesNeverOverdraw races 100 charges for a balance that
// covers exactly 50 of them.
func TestConcurrentDistinctChargesNeverOverdraw(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 50*40)

	const n = 100
	statuses := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := uuid.NewString()
			<-start
			// As a client would: retry a 503 or 409 with the same key until the
			// answer is definite. On a starved machine the queue on the one
			// account can outlast the wait bound.
			for attempt := 0; attempt < 20; attempt++ {
				statuses[i] = f.post("/v1/charges", key, chargeBody(acct, 40)).status
				if statuses[i] != http.StatusServiceUnavailable && statuses[i] != http.StatusConflict {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	close(start)
	wg.Wait()

	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[http.StatusCreated] != 50 || count[http.StatusPaymentRequired] != 50 {
		t.Errorf("statuses = %v, want 50 × 201 and 50 × 402", count)
	}
	if got := f.balance(acct); got != 0 {
		t.Errorf("balance = %d, want 0", got)
	}
	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'succeeded'`); n != 50 {
		t.Errorf("%d succeeded charges, want 50", n)
	}
	f.checkLedger(acct)
}

// TestFailureAfterClaimRollsBackEverything injects a fault inside the
// transaction, after the key is claimed: nothing may remain, and the retry
// then charges once.
func TestFailureAfterClaimRollsBackEverything(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) })
	acct := f.account("USD", 1000)
	ctx := context.Background()
	_, err := f.db.Exec(ctx, `
CREATE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected fault'; END $$;
CREATE TRIGGER inject_fault BEFORE INSERT ON charges FOR EACH ROW EXECUTE FUNCTION inject_fault();`)
	if err != nil {
		t.Fatal(err)
	}

	key := uuid.NewString()
	r := f.post("/v1/charges", key, chargeBody(acct, 400))
	if r.status != http.StatusInternalServerError || r.code(t) != "internal-error" {
		t.Fatalf("got %d %s, want 500 internal-error", r.status, r.body)
	}
	if strings.Contains(string(r.body), "injected") {
		t.Errorf("the driver's error text reached the client: %s", r.body)
	}
	if f.keys() != 2 || f.charges() != 0 || f.balance(acct) != 1000 {
		t.Fatalf("after the fault: %d keys (want 2: account and deposit), %d charges (want 0), balance %d (want 1000)",
			f.keys(), f.charges(), f.balance(acct))
	}

	if _, err := f.db.Exec(ctx, `DROP TRIGGER inject_fault ON charges`); err != nil {
		t.Fatal(err)
	}
	r = f.post("/v1/charges", key, chargeBody(acct, 400))
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the fault: %d %s, want a fresh 201", r.status, r.body)
	}
	if f.charges() != 1 || f.balance(acct) != 600 {
		t.Errorf("after the retry: %d charges (want 1), balance %d (want 600)", f.charges(), f.balance(acct))
	}
	f.checkLedger(acct)
}

// TestTransientFailuresAreRetried: a transaction that ends in a serialization
// failure or a deadlock runs again, three attempts in all. Two failures cost
// nothing but time: the deposit is made once. A third is answered 500, with
// nothing of the three attempts left behind, and no fourth is made.
func TestTransientFailuresAreRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, sqlstate string }{
		{"serialization failure", "40001"},
		{"deadlock", "40P01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, func(o *setupOptions) { o.databaseURL, o.cacheSize = pgtest.NewDatabase(t), 0 })
			acct := f.account("USD", 0)
			ctx := context.Background()
			// Every attempt's insert of the deposit draws a number from a
			// sequence, which no rollback gives back; the first `failures`
			// attempts end in the error.
			inject := func(failures int) {
				t.Helper()
				if _, err := f.db.Exec(ctx, fmt.Sprintf(`
DROP TRIGGER IF EXISTS inject_fault ON deposits;
DROP SEQUENCE IF EXISTS attempts;
CREATE SEQUENCE attempts;
CREATE OR REPLACE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('attempts') <= TG_ARGV[1]::int THEN
        RAISE EXCEPTION 'injected transient fault' USING ERRCODE = TG_ARGV[0];
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER inject_fault BEFORE INSERT ON deposits
    FOR EACH ROW EXECUTE FUNCTION inject_fault('%s', '%d');`, tc.sqlstate, failures)); err != nil {
					t.Fatal(err)
				}
			}
			attempts := func() int {
				t.Helper()
				var n int
				if err := f.db.QueryRow(ctx, `SELECT last_value FROM attempts`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			deposits := func() int { return f.count(`SELECT count(*) FROM deposits WHERE merchant_id = $1`) }
			events := func() int {
				return f.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = 'deposit.created'`)
			}
			path := "/v1/accounts/" + acct + "/deposits"

			inject(2)
			if r := f.post(path, uuid.NewString(), `{"amount":500}`); r.status != http.StatusCreated {
				t.Fatalf("after two %s errors: %d %s, want 201", tc.sqlstate, r.status, r.body)
			}
			if n := attempts(); n != 3 {
				t.Errorf("%d attempts, want 3", n)
			}
			if f.balance(acct) != 500 || deposits() != 1 || events() != 1 {
				t.Errorf("balance %d, %d deposits, %d events; want 500, 1, 1", f.balance(acct), deposits(), events())
			}

			inject(1000)
			keys := f.keys()
			key := uuid.NewString()
			r := f.post(path, key, `{"amount":70}`)
			if r.status != http.StatusInternalServerError || r.code(t) != "internal-error" {
				t.Fatalf("after three %s errors: %d %s, want 500 internal-error", tc.sqlstate, r.status, r.body)
			}
			if n := attempts(); n != 3 {
				t.Errorf("%d attempts, want 3 and no more", n)
			}
			if f.balance(acct) != 500 || deposits() != 1 || events() != 1 || f.keys() != keys {
				t.Errorf("after the refusal: balance %d, %d deposits, %d events, %d keys; want 500, 1, 1, %d",
					f.balance(acct), deposits(), events(), f.keys(), keys)
			}
			if _, err := f.db.Exec(ctx, `DROP TRIGGER inject_fault ON deposits`); err != nil {
				t.Fatal(err)
			}
			if r := f.post(path, key, `{"amount":70}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry with the key once the fault is gone: %d %s, want a fresh 201", r.status, r.body)
			}
			if f.balance(acct) != 570 || deposits() != 2 || events() != 2 {
				t.Errorf("balance %d, %d deposits, %d events; want 570, 2, 2", f.balance(acct), deposits(), events())
			}
		})
	}
}

// TestRequestWaitsForInFlightKey holds a key in an open transaction, as an
// in-flight request would: a duplicate waits, gives up with 409 past the
// bound, and replays the outcome once the holder commits.
func TestRequestWaitsForInFlightKey(t *testing.T) {
	t.Parallel()
	// The bound leaves the holder's commit, 100 ms after the waiting request
	// leaves, a wide margin on a loaded machine (300 ms was once too little
	// beside CI's parallel packages).
	const bound = time.Second
	f := setup(t, func(o *setupOptions) { o.keyWait = bound })
	acct := f.account("USD", 1000)
	key := uuid.NewString()
	body := chargeBody(acct, 100)
	canonical, err := idempotency.Canonicalize([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	fp := idempotency.NewFingerprint(http.MethodPost, "/v1/charges", canonical)

	ctx := context.Background()
	holder, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) // a no-op once committed below
	// What a request in flight holds: the key's advisory lock and its row.
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`, f.merchantID, key); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ($1, $2, $3)`,
		f.merchantID, key, fp[:]); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	r := f.post("/v1/charges", key, body)
	if r.status != http.StatusConflict || r.code(t) != "idempotency-key-in-use" || r.header.Get("Retry-After") == "" {
		t.Fatalf("got %d %v %s, want 409 idempotency-key-in-use with Retry-After", r.status, r.header, r.body)
	}
	if waited := time.Since(began); waited < bound {
		t.Errorf("answered after %v, before the wait bound", waited)
	}

	waiting := make(chan reply)
	go func() { waiting <- f.post("/v1/charges", key, body) }()
	time.Sleep(100 * time.Millisecond) // let it reach the key's index entry
	// The holder stores the answer of a charge it made up: the waiting request
	// must replay exactly that, not execute.
	accountID, _ := payment.ParseID(payment.PrefixAccount, acct)
	held := payment.Charge{ID: payment.NewID(), AccountID: accountID, Amount: 100, Currency: "USD",
		Status: payment.ChargeSucceeded, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	stored, err := json.Marshal(held)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `UPDATE idempotency_keys SET status = 201, location = $3, body = $4
WHERE merchant_id = $1 AND key = $2`, f.merchantID, key, "/v1/charges/"+payment.FormatID(payment.PrefixCharge, held.ID), stored); err != nil {
		t.Fatal(err)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-waiting
	if r.status != http.StatusCreated || !bytes.Equal(r.body, stored) || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the waiting request got %d %s, want the holder's stored response", r.status, r.body)
	}
	if f.charges() != 0 || f.balance(acct) != 1000 {
		t.Errorf("%d charges, balance %d: the waiting request must not execute", f.charges(), f.balance(acct))
	}
}

// TestKeysAreScopedPerMerchant: two merchants may use one key independently,
// and neither can reach the other's objects.
func TestKeysAreScopedPerMerchant(t *testing.T) {
	t.Parallel()
	a := setup(t)
	b := a.otherMerchant()
	acctA := a.account("USD", 1000)
	acctB := b.account("USD", 1000)
	key := "order-42" // the same key for both merchants

	ra := a.post("/v1/charges", key, chargeBody(acctA, 100))
	rb := b.post("/v1/charges", key, chargeBody(acctB, 200))
	if ra.status != http.StatusCreated || rb.status != http.StatusCreated || rb.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("A: %d %s; B: %d %s; want two independent 201s", ra.status, ra.body, rb.status, rb.body)
	}
	chargeA := ra.json(t)["id"].(string)

	// B cannot read or use A's objects, nor replay A's response.
	for _, path := range []string{"/v1/charges/" + chargeA, "/v1/accounts/" + acctA} {
		if r := b.get(path); r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Errorf("B GET %s = %d %s, want 404", path, r.status, r.body)
		}
	}
	if r := b.post("/v1/charges", uuid.NewString(), chargeBody(acctA, 100)); r.status != http.StatusNotFound || r.code(t) != "account-not-found" {
		t.Errorf("B charging A's account = %d %s, want 404 account-not-found", r.status, r.body)
	}
	if r := b.post("/v1/accounts/"+acctA+"/deposits", uuid.NewString(), `{"amount":5}`); r.status != http.StatusNotFound {
		t.Errorf("B depositing into A's account = %d %s, want 404", r.status, r.body)
	}
	if r := b.post("/v1/charges", key, chargeBody(acctA, 100)); r.status != http.StatusUnprocessableEntity {
		t.Errorf("B replaying A's request under B's own key = %d %s, want 422 (B's key holds B's request)", r.status, r.body)
	}

	if a.balance(acctA) != 900 || b.balance(acctB) != 800 {
		t.Errorf("balances A %d (want 900), B %d (want 800)", a.balance(acctA), b.balance(acctB))
	}
	if a.charges() != 1 || b.charges() != 1 {
		t.Errorf("A has %d charges, B %d; want one each", a.charges(), b.charges())
	}
	a.checkLedger(acctA)
	b.checkLedger(acctB)
}

// TestExpiredKeyExecutesAsNew: past IDEMPOTENCY_TTL a key is forgotten, even
// before the janitor deletes it.
func TestExpiredKeyExecutesAsNew(t *testing.T) {
	t.Parallel()
	// The database's clock is moved here, not the process's: no response cache.
	f := setup(t, func(o *setupOptions) { o.cacheSize = 0 })
	acct := f.account("USD", 1000)
	key := uuid.NewString()
	if r := f.post("/v1/charges", key, chargeBody(acct, 100)); r.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", r.status, r.body)
	}
	if _, err := f.db.Exec(context.Background(),
		`UPDATE idempotency_keys SET created_at = now() - interval '24 hours 1 second' WHERE merchant_id = $1 AND key = $2`,
		f.merchantID, key); err != nil {
		t.Fatal(err)
	}
	r := f.post("/v1/charges", key, chargeBody(acct, 100))
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after expiry: %d %s, want a new 201", r.status, r.body)
	}
	if f.charges() != 2 || f.balance(acct) != 800 || f.keys() != 3 {
		t.Errorf("%d charges (want 2), balance %d (want 800), %d keys (want 3)", f.charges(), f.balance(acct), f.keys())
	}
}

// TestLargeResponsesAreStoredCompressed: a response over 1 KiB is kept
// zstd-compressed and still replays byte for byte, on the charge's fast path
// and on the general path alike.
func TestLargeResponsesAreStoredCompressed(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.cacheSize = 0 }) // replays must come from the table
	var meta []string
	for i := range 50 {
		meta = append(meta, fmt.Sprintf(`"key_%02d":"%s"`, i, strings.Repeat("v", 40)))
	}
	metadata := `"metadata":{` + strings.Join(meta, ",") + `}`

	acctKey := uuid.NewString()
	acctBody := `{"currency":"USD",` + metadata + `}`
	first := f.post("/v1/accounts", acctKey, acctBody)
	acct, _ := first.json(t)["id"].(string)
	f.post("/v1/accounts/"+acct+"/deposits", uuid.NewString(), `{"amount":1000}`)
	chargeKey := uuid.NewString()
	chargeReq := `{"account_id":"` + acct + `","amount":10,"currency":"USD",` + metadata + `}`
	charge := f.post("/v1/charges", chargeKey, chargeReq)

	for _, c := range []struct {
		name, path, key, body string
		first                 reply
	}{
		{"account (general path)", "/v1/accounts", acctKey, acctBody, first},
		{"charge (fast path)", "/v1/charges", chargeKey, chargeReq, charge},
	} {
		if c.first.status != http.StatusCreated || len(c.first.body) <= 1024 {
			t.Fatalf("%s: %d, %d bytes; want a 201 over 1 KiB", c.name, c.first.status, len(c.first.body))
		}
		var encoding *string
		var stored int
		if err := f.db.QueryRow(context.Background(), `SELECT body_encoding, octet_length(body) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`,
			f.merchantID, c.key).Scan(&encoding, &stored); err != nil {
			t.Fatal(err)
		}
		if encoding == nil || *encoding != "zstd" || stored >= len(c.first.body) {
			t.Errorf("%s: stored %d bytes with encoding %v for a %d-byte body", c.name, stored, encoding, len(c.first.body))
		}
		again := f.post(c.path, c.key, c.body)
		if !bytes.Equal(again.body, c.first.body) || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: the replay differs from the original", c.name)
		}
	}
	if f.balance(acct) != 990 {
		t.Errorf("balance %d, want 990", f.balance(acct))
	}
}

// TestJanitorKeepsLiveKeys: the janitor, run against the service's store,
// leaves a key younger than the retention alone (its retry still replays from
// the table) and deletes it once it is older.
func TestJanitorKeepsLiveKeys(t *testing.T) {
	t.Parallel()
	// A database of its own: a sweep deletes every expired key in it.
	f := setup(t, func(o *setupOptions) { o.databaseURL, o.cacheSize = pgtest.NewDatabase(t), 0 })
	acct := f.account("USD", 1000)
	key := uuid.NewString()
	first := f.post("/v1/charges", key, chargeBody(acct, 100))
	if first.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.status, first.body)
	}
	const ttl = 24 * time.Hour
	janitor := idempotency.NewJanitor(f.store, slog.New(slog.DiscardHandler), ttl, time.Hour, 100, time.Millisecond)
	ctx := context.Background()
	if n, err := janitor.Sweep(ctx); err != nil || n != 0 || f.keys() != 3 {
		t.Fatalf("a sweep of live keys deleted %d (%v); %d keys left, want 3", n, err, f.keys())
	}
	if again := f.post("/v1/charges", key, chargeBody(acct, 100)); !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the sweep: %d %s, want the stored answer", again.status, again.body)
	}
	if _, err := f.db.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - $3::interval - interval '1 second'
WHERE merchant_id = $1 AND key = $2`, f.merchantID, key, ttl); err != nil {
		t.Fatal(err)
	}
	if n, err := janitor.Sweep(ctx); err != nil || n != 1 || f.keys() != 2 {
		t.Errorf("a sweep with one expired key deleted %d (%v); %d keys left, want 2", n, err, f.keys())
	}
	if f.charges() != 1 || f.balance(acct) != 900 {
		t.Errorf("%d charges, balance %d; want 1 and 900", f.charges(), f.balance(acct))
	}
}
