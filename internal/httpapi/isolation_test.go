package httpapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// Over HTTP: a batch of charges is as safe as a lone charge. Each
// test here failed before: a client that left stopped all charging, and one
// member's locked account or in-flight twin answered its neighbours 503.

// timedReply is an answer and how long it took; err is the transport's
// (a timeout: no answer at all).
type timedReply struct {
	reply
	took time.Duration
	err  error
}

// postAll sends the requests at once (released together), each with a
// client-side timeout, and returns their answers in order.
func (f *fixture) postAll(timeout time.Duration, reqs []*http.Request) []timedReply {
	client := &http.Client{Timeout: timeout}
	out := make([]timedReply, len(reqs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			<-start
			began := time.Now()
			resp, err := client.Do(req)
			out[i].took = time.Since(began)
			if err != nil {
				out[i].err = err
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			out[i].reply, out[i].err = reply{status: resp.StatusCode, header: resp.Header, body: body}, err
		})
	}
	close(start)
	wg.Wait()
	return out
}

// lockRow locks the row of account (an acct_ id) in a transaction of the
// test's own until release (or the test's end), as another replica's batch,
// an operator or a commit waiting for the standby would.
func (f *fixture) lockRow(t *testing.T, account string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := payment.ParseID(payment.PrefixAccount, account)
	if _, err := tx.Exec(ctx, `SELECT FROM accounts WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	return release
}

// TestHalfClosedClientsDoNotStopCharging: clients that send a charge of
// about 60 KB and half-close their connection at once (so the server sees
// them leave while their request is read or queued) never stop the charge
// path: a charge sent afterwards is answered at once. Before, one of them
// could keep the batch slot, and every later charge in the process hung
// while deposits and /readyz went on. Each departed charge either committed
// whole or left nothing.
func TestHalfClosedClientsDoNotStopCharging(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.keyWait = 2 * time.Second })
	acct := f.account("USD", 1_000_000)
	addr := strings.TrimPrefix(f.url, "http://")
	var keys []string
	for round := range 10 {
		var wg sync.WaitGroup
		for range 3 {
			key := uuid.NewString()
			keys = append(keys, key)
			wg.Go(func() { f.sendAndHalfClose(t, addr, key, acct) })
		}
		wg.Wait()
		r := f.postAll(4*time.Second, []*http.Request{f.request(http.MethodPost, "/v1/charges", uuid.NewString(), chargeBody(acct, 1))})[0]
		if r.err != nil || r.status != http.StatusCreated {
			t.Fatalf("round %d: a charge after clients that left: %v %d %s; the charge path stopped", round, r.err, r.status, r.body)
		}
	}
	// Each departed charge committed whole (its key stored with its 201 and
	// the balance debited) or left nothing.
	stored := 0
	for _, key := range keys {
		if f.storedStatus(key) == http.StatusCreated {
			stored++
		}
	}
	if got, want := f.balance(acct), int64(1_000_000-10-100*stored); got != want {
		t.Errorf("balance %d, want %d: 10 charges of 1 and %d departed charges of 100 that committed", got, want, stored)
	}
	f.checkLedger(acct)
}

// sendAndHalfClose sends a charge of 100 with about 60 KB of JSON whitespace
// on a connection of its own and half-closes it right after, as a client
// that gives up at once does; it reads whatever comes back.
func (f *fixture) sendAndHalfClose(t *testing.T, addr, key, acct string) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	body := `{"account_id":"` + acct + `",` + strings.Repeat(" ", 60<<10) + `"amount":100,"currency":"USD"}`
	fmt.Fprintf(conn, "POST /v1/charges HTTP/1.1\r\nHost: payments\r\nAuthorization: Bearer %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", f.apiKey, key, len(body), body)
	_ = conn.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.Copy(io.Discard, bufio.NewReader(conn))
}

// TestLockedAccountFailsNoNeighbour: one account row locked elsewhere past
// the bound while 40 charges arrive at once (1 on it, 39 on free accounts of
// two merchants): the 39 are answered 201 without waiting, the one 503 with
// Retry-After after the bound, changing nothing. Then a merchant's account
// locked while its customers keep charging it: another merchant's charges on
// its own account all answer 201 at once.
func TestLockedAccountFailsNoNeighbour(t *testing.T) {
	t.Parallel()
	const wait = 2 * time.Second
	f := setup(t, func(o *setupOptions) { o.keyWait = wait })
	g := f.otherMerchant()
	locked := f.account("USD", 10_000)
	release := f.lockRow(t, locked)
	var reqs []*http.Request
	var free []string
	for i := range 39 {
		h := f
		if i%2 == 1 {
			h = g
		}
		a := h.account("USD", 10_000)
		free = append(free, a)
		reqs = append(reqs, h.request(http.MethodPost, "/v1/charges", uuid.NewString(), chargeBody(a, 100)))
	}
	lockedKey := uuid.NewString()
	reqs = append(reqs, f.request(http.MethodPost, "/v1/charges", lockedKey, chargeBody(locked, 100)))
	answers := f.postAll(3*wait, reqs)
	for i, a := range answers[:39] {
		if a.err != nil || a.status != http.StatusCreated || a.took > wait/2 {
			t.Errorf("charge %d on a free account: %v %d after %v; want 201 at once", i, a.err, a.status, a.took)
		}
	}
	// The lower bound allows 50 ms for the two clocks the wait is measured by
	// (PostgreSQL's, which ends the lock wait, and this test's).
	if a := answers[39]; a.err != nil || a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" ||
		a.took < wait-50*time.Millisecond || a.took > wait+1500*time.Millisecond {
		t.Errorf("the charge on the locked account: %v %d (Retry-After %q) after %v; want 503 after about %v",
			a.err, a.status, a.header.Get("Retry-After"), a.took, wait)
	}
	release()
	if status := f.storedStatus(lockedKey); status != 0 || f.balance(locked) != 10_000 {
		t.Errorf("the 503 stored %d and left balance %d; want nothing stored, 10000", status, f.balance(locked))
	}
	for i, a := range free {
		h := f
		if i%2 == 1 {
			h = g
		}
		if b := h.balance(a); b != 9_900 {
			t.Errorf("free account %d: balance %d, want 9900", i, b)
		}
	}

	// Merchant f's account locked while f's customers charge it; g's
	// customers charge g's own account meanwhile.
	release = f.lockRow(t, locked)
	time.AfterFunc(wait/2, release)
	theirs := g.account("USD", 10_000)
	reqs = reqs[:0]
	for i := range 50 {
		if i%2 == 0 {
			reqs = append(reqs, f.request(http.MethodPost, "/v1/charges", uuid.NewString(), chargeBody(locked, 10)))
		} else {
			reqs = append(reqs, g.request(http.MethodPost, "/v1/charges", uuid.NewString(), chargeBody(theirs, 10)))
		}
	}
	for i, a := range f.postAll(3*wait, reqs) {
		switch {
		case a.err != nil || a.status != http.StatusCreated:
			t.Errorf("charge %d: %v %d %s; want 201", i, a.err, a.status, a.body)
		case i%2 == 1 && a.took > wait/2:
			t.Errorf("the other merchant's charge %d took %v behind the locked account", i, a.took)
		}
	}
	if a, b := f.balance(locked), g.balance(theirs); a != 9_750 || b != 9_750 {
		t.Errorf("balances %d and %d, want 9750 and 9750", a, b)
	}
	f.checkLedger(locked)
}

// TestRetryOfInFlightTwinWaitsAlone: a retry whose twin is in flight
// elsewhere (its key and its account's row held by another transaction)
// waits for the twin holding nothing: charges on other accounts arriving with
// it or after it are answered at once, and it answers 409 after the bound.
func TestRetryOfInFlightTwinWaitsAlone(t *testing.T) {
	t.Parallel()
	const wait = 2 * time.Second
	f := setup(t, func(o *setupOptions) { o.keyWait = wait })
	acct := f.account("USD", 10_000)
	for _, arrival := range []string{"with its batch-mates", "alone, before them"} {
		key, body := uuid.NewString(), chargeBody(acct, 100)
		f.holdKey(t, key, http.MethodPost, "/v1/charges", body)
		release := f.lockRow(t, acct)
		retry := make(chan timedReply, 1)
		reqs := []*http.Request{f.request(http.MethodPost, "/v1/charges", key, body)}
		if arrival != "with its batch-mates" {
			alone := reqs
			go func() { retry <- f.postAll(3*wait, alone)[0] }()
			time.Sleep(100 * time.Millisecond)
			reqs = nil
		}
		var free []string
		for range 39 {
			a := f.account("USD", 1_000)
			free = append(free, a)
			reqs = append(reqs, f.request(http.MethodPost, "/v1/charges", uuid.NewString(), chargeBody(a, 1)))
		}
		answers := f.postAll(3*wait, reqs)
		if arrival == "with its batch-mates" {
			retry <- answers[0]
			answers = answers[1:]
		}
		for i, a := range answers {
			if a.err != nil || a.status != http.StatusCreated || a.took > wait/2 {
				t.Errorf("%s: charge %d on a free account: %v %d after %v; want 201 at once", arrival, i, a.err, a.status, a.took)
			}
		}
		if a := <-retry; a.err != nil || a.status != http.StatusConflict || a.code(t) != "idempotency-key-in-use" {
			t.Errorf("%s: the retry: %v %d %s; want 409 idempotency-key-in-use", arrival, a.err, a.status, a.body)
		}
		for _, a := range free {
			if b := f.balance(a); b != 999 {
				t.Errorf("%s: balance %d, want 999", arrival, b)
			}
		}
		release()
	}
}

// TestAbandonedChargeIsNot500: a charge whose client leaves while its batch
// runs (queued behind a slow one, here slowed by a trigger, so its batch runs
// on another goroutine) is answered 503,
// the outcome unknown to the client, never 500 "nothing was changed": it
// commits, and its retry replays the 201. The departure is not logged as a
// failure of the service.
func TestAbandonedChargeIsNot500(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) })
	acct := f.account("USD", 1_000)
	if _, err := f.db.Exec(context.Background(), `
CREATE FUNCTION slow_7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$;
CREATE TRIGGER slow_7 BEFORE INSERT ON charges FOR EACH ROW WHEN (NEW.amount = 7) EXECUTE FUNCTION slow_7();`); err != nil {
		t.Fatal(err)
	}
	first := make(chan timedReply, 1)
	go func() {
		first <- f.postAll(5*time.Second, []*http.Request{f.request(http.MethodPost, "/v1/charges", uuid.NewString(), chargeBody(acct, 7))})[0]
	}()
	waitFor(t, "the first charge's batch to run", func() bool { return f.store.Stats().BatchAge > 0 })
	key := uuid.NewString()
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(f.request(http.MethodPost, "/v1/charges", key, chargeBody(acct, 7)).WithContext(ctx))
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	waitFor(t, "the second charge to queue", func() bool { return f.store.Stats().Queued > 0 })
	if a := <-first; a.err != nil || a.status != http.StatusCreated {
		t.Fatalf("the first charge: %v %d", a.err, a.status)
	}
	// The second's batch left before the first was answered; it runs 0.5 s.
	time.Sleep(100 * time.Millisecond)
	leave()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the leaving client got %v, want its own cancellation", err)
	}
	time.Sleep(time.Second) // the departed charge's batch ends
	metrics := f.scrape()
	if strings.Contains(metrics, `route="/v1/charges",status="500"`) {
		t.Errorf("a charge was answered 500:\n%s", grepLines(metrics, `route="/v1/charges"`))
	}
	if !strings.Contains(metrics, `route="/v1/charges",status="503"`) {
		t.Errorf("the departed charge was not answered 503:\n%s", grepLines(metrics, `route="/v1/charges"`))
	}
	if strings.Contains(f.logs.String(), `"msg":"request failed"`) {
		t.Errorf("a client's departure was logged as a failure:\n%s", f.logs.String())
	}
	r := f.post("/v1/charges", key, chargeBody(acct, 7))
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry: %d %s, want the committed 201 replayed", r.status, r.body)
	}
	if b := f.balance(acct); b != 986 {
		t.Errorf("balance %d, want 986", b)
	}
}

// waitFor waits up to 10 s for cond, failing t with what it waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// storedStatus is the status stored under the merchant's key, 0 when the
// key is not stored.
func (f *fixture) storedStatus(key string) int {
	f.t.Helper()
	return f.count(`SELECT coalesce(max(status), 0) FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`, key)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
