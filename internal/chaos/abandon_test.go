package chaos_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// TestAbandoningClients: clients that give up on their charges at
// every point a request can be abandoned (before its body is read, while it
// waits for a batch, while its batch runs or commits) charge beside clients
// that charge normally, while now and then an outside transaction locks one
// of the accounts for up to 1.5 s (IDEMPOTENCY_WAIT is 1 s). Before and after,
// the normal clients alone measure the process's throughput: afterwards it is
// at least 90 % of before, or of a twin that saw everything but the leaving
// clients (a departed client once kept the only batch slot, and charging
// stopped). Every abandoned charge is then retried with its key
// and body, and every answer any client holds is true: stored under its key
// byte for byte, the balances are what the answers say, one charge per key,
// no 500, and /readyz is 200 with no batch left running.
func TestAbandoningClients(t *testing.T) {
	var (
		measure  = scale(2*time.Second, 8*time.Second)
		duration = scale(5*time.Second, 40*time.Second)
		workers  = scale(6, 12)
		leavers  = scale(6, 12)
		nAcct    = scale(6, 20)
	)
	s := startScenario(t, scale(2*time.Minute, 10*time.Minute), testDatabase, "abandon")
	ctx, bin, dbURL, m, db, record := s.ctx, s.bin, s.dbURL, s.merchants[0], s.db, s.record
	natsURL := testkit.StartNATS(t).URL()
	// The outbox's relay runs in a replica of its own, started first so that
	// it holds the lease. The process under test (svc) has a twin that lives
	// through the same scenario except its leaving clients: the normal
	// clients charge either, at random. Neither relays, so the two do the
	// same work and can be measured against each other (below).
	relayer := newService(t, bin, serviceConfig{databaseURL: dbURL, natsURL: natsURL})
	waitFor(t, ctx, "the relay replica to lead", func() bool {
		return strings.Contains(relayer.logs.String(), `"msg":"relay is the leader"`)
	})
	svc := newService(t, bin, serviceConfig{databaseURL: dbURL, natsURL: natsURL, extra: []string{"IDEMPOTENCY_WAIT=1s"}})
	twin := newService(t, bin, serviceConfig{databaseURL: dbURL, natsURL: natsURL, extra: []string{"IDEMPOTENCY_WAIT=1s"}})
	c := newClient(t, m.APIKey, "abandon-key-", func(int) string { return svc.url() })

	var accounts []string
	for range nAcct {
		acct := c.mustAccount(t, ctx, usd)
		accounts = append(accounts, acct)
		record(drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
			amount: 50_000_000, body: []byte(`{"amount":50000000}`)}))
	}
	charge := func(ctx context.Context, c *client, accounts []string) op {
		acct := accounts[rand.IntN(len(accounts))]
		amount := 1 + rand.Int64N(500)
		return drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount)})
	}
	// A measurement starts from the same state each time: the outbox
	// drained, a checkpoint taken, and a new client for each load (a client's
	// own state must not weigh on one measurement more than another). load
	// runs the normal clients against the service at url on accts for d and
	// returns their charges/s; its requests are added to measured.
	var measured atomic.Int64
	settle := func() {
		waitDrained(t, ctx, db)
		_, err := db.Exec(ctx, `CHECKPOINT`)
		must(t, err, "checkpoint")
	}
	load := func(url string, accts []string, d time.Duration) float64 {
		c := newClient(t, m.APIKey, "abandon-key-", func(int) string { return url })
		defer func() {
			st := c.stats
			measured.Add(st.requests.Load())
			if bad := st.internal.Load() + st.badProblems.Load(); bad > 0 {
				t.Errorf("%d answers of a measurement were 500 or problems without their type or Retry-After", bad)
			}
		}()
		until := time.Now().Add(d)
		var n atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for time.Now().Before(until) && ctx.Err() == nil {
					if o := charge(ctx, c, accts); o.answer.status != 0 {
						record(o)
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return float64(n.Load()) / d.Seconds()
	}
	rate := func(url string, d time.Duration) float64 {
		settle()
		return load(url, accounts, d)
	}
	before := rate(svc.url(), measure)

	// The scenario: normal clients (of svc and its twin), leaving clients (of
	// svc alone), an outside locker.
	either := newClient(t, m.APIKey, "abandon-key-", func(int) string {
		if rand.IntN(2) == 0 {
			return twin.url()
		}
		return svc.url()
	})
	chaosCtx, stopChaos := context.WithTimeout(ctx, duration)
	defer stopChaos()
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex // guards abandoned
		abandoned []op       // sent and given up on: retried afterwards with their keys
		ways      [4]atomic.Int64
		locks     atomic.Int64
	)
	for range workers {
		wg.Go(func() {
			for chaosCtx.Err() == nil {
				if o := charge(ctx, either, accounts); o.answer.status != 0 {
					record(o)
				}
			}
		})
	}
	leaverTr := &http.Transport{}
	t.Cleanup(leaverTr.CloseIdleConnections)
	leaver := &http.Client{Transport: leaverTr}
	addr := strings.TrimPrefix(svc.url(), "http://")
	for range leavers {
		wg.Go(func() {
			for chaosCtx.Err() == nil {
				acct := accounts[rand.IntN(len(accounts))]
				amount := 1 + rand.Int64N(500)
				o := op{kind: "charge", key: c.newKey(), path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount)}
				way := rand.IntN(len(ways))
				ways[way].Add(1)
				if way == 0 {
					// Before its body is read: headers and half the body, then gone.
					sendHalfAndClose(addr, m.APIKey, o)
				} else {
					// Given up after 0–40 ms: while queued, while its batch
					// runs, or during its COMMIT.
					leave(leaver, svc.url(), m.APIKey, o, time.Duration(rand.IntN(40_000))*time.Microsecond)
				}
				mu.Lock()
				abandoned = append(abandoned, o)
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for chaosCtx.Err() == nil {
			select {
			case <-chaosCtx.Done():
				return
			case <-time.After(100*time.Millisecond + rand.N(400*time.Millisecond)):
			}
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Errorf("locker: %v", err)
				return
			}
			acct := strings.TrimPrefix(accounts[rand.IntN(len(accounts))], "acct_")
			if _, err := tx.Exec(ctx, `SELECT FROM accounts WHERE id = $1::uuid FOR UPDATE`, acct); err != nil {
				t.Errorf("locker: %v", err)
			}
			locks.Add(1)
			time.Sleep(200*time.Millisecond + rand.N(1300*time.Millisecond))
			_ = tx.Rollback(ctx)
		}
	})
	wg.Wait()

	// Afterwards, the normal clients alone again. On a machine whose other
	// load changes meanwhile (a shared CI machine; make test runs this
	// package after the others, alone), before and after are not alike; then svc is measured against
	// its twin side by side, at the same time, each on half the accounts, so
	// that whatever slows the machine slows both. A fresh process is no
	// yardstick: one started now charges about a tenth faster than any that
	// has served a while, with or without leaving clients (measured while
	// building this test). The rounds are judged by their median ratio: a
	// checkpoint or an autovacuum that lands in one does not decide it. Five
	// rounds of twice the measurement's length: with three of one length, the
	// ratio of two equal processes fell under 0.9 in one CI run of six.
	waitFor(t, ctx, "the service to go idle after the scenario", func() bool {
		metrics := scrapeService(t, svc)
		return !slices.ContainsFunc(idleMetrics, func(line string) bool { return !strings.Contains(metrics, line) })
	})
	after := rate(svc.url(), measure)
	kept := after / before
	var paired string
	if kept < 0.9 {
		var mine, theirs float64
		rounds, window := 5, 2*measure
		ratios := make([]float64, rounds)
		half := len(accounts) / 2
		for i := range rounds {
			settle()
			ours, twins := accounts[:half], accounts[half:]
			if i%2 == 1 { // each side on each half of the accounts in turn
				ours, twins = twins, ours
			}
			var m, f float64
			var both sync.WaitGroup
			both.Go(func() { m = load(svc.url(), ours, window) })
			both.Go(func() { f = load(twin.url(), twins, window) })
			both.Wait()
			mine, theirs, ratios[i] = mine+m, theirs+f, m/f
		}
		byRound := fmt.Sprintf("%.2f", ratios)
		slices.Sort(ratios)
		kept = ratios[rounds/2]
		paired = fmt.Sprintf("; after ÷ before %.0f %%, so measured beside its twin that saw no leaving client (%d rounds of %s, ratios %s, median %.2f): %.0f vs %.0f charges/s",
			100*after/before, rounds, window, byRound, kept, mine/float64(rounds), theirs/float64(rounds))
	}
	if kept < 0.9 {
		t.Errorf("throughput after the scenario %.0f %% of before (%.0f vs %.0f charges/s%s): below 90 %%", 100*kept, after, before, paired)
	}

	// Every abandoned charge, retried with its key and body, gets a definite
	// answer: its stored one if it executed, else a fresh execution.
	for _, o := range abandoned {
		a, attempts, err := c.definite(ctx, http.MethodPost, o.path, o.key, o.body)
		must(t, err, "retry an abandoned charge")
		o.answer, o.attempts = a, attempts
		record(o)
	}

	// The process is ready, no batch is left running, and it saw clients leave.
	if a, err := c.send(ctx, 1, http.MethodGet, "/readyz", "", nil); err != nil || a.status != http.StatusOK {
		t.Errorf("/readyz after the scenario: %d %s (%v)", a.status, a.body, err)
	}
	metrics := scrapeService(t, svc)
	for _, line := range idleMetrics[:2] {
		if !strings.Contains(metrics, line) {
			t.Errorf("after the scenario the metrics lack %q", strings.TrimSpace(line))
		}
	}
	leftCounts := abandonedCounts(metrics)
	for i, line := range failedAbandoned.FindAllString(svc.logs.String(), -1) {
		if i == 3 {
			break
		}
		t.Logf("an abandoned charge that failed: %s", line)
	}
	if leftCounts["executed"]+leftCounts["not_executed"] == 0 {
		t.Errorf("no charge was reported abandoned (%v): the scenario did not abandon any while queued or in a batch", leftCounts)
	}

	twin.stop()
	end := s.judge(t, svc, natsURL, c)
	for _, other := range []*service{twin, relayer} {
		if leaked := logsMention(other.logs.String(), c.keyPrefix, m.APIKey); len(leaked) > 0 {
			t.Errorf("a replica logged %q", leaked)
			end.broken++
		}
	}
	if bad := either.stats.internal.Load() + either.stats.badProblems.Load(); bad > 0 {
		t.Errorf("%d answers of the normal clients were 500 or problems without their type or Retry-After", bad)
		end.badAnswers += int(bad)
	}
	st := c.stats
	t.Logf("throughput before %.0f charges/s, after %.0f (%.0f %%%s); %d abandoned (%d before the body, %d, %d, %d given up after 0-40 ms), "+
		"reported by the service %v; %d account locks; %d operations, %d 503, %d 409 in-use",
		before, after, 100*kept, paired, len(abandoned), ways[0].Load(), ways[1].Load(), ways[2].Load(), ways[3].Load(),
		leftCounts, locks.Load(), len(s.recorded()), st.unavailable.Load()+either.stats.unavailable.Load(), st.inUse.Load()+either.stats.inUse.Load())

	summary{
		scenario: "abandoning clients (gone before the body, while queued, in a batch, at COMMIT) and locked accounts",
		requests: st.requests.Load() + either.stats.requests.Load() + measured.Load(),
		faults: fmt.Sprintf("%d abandoned charges, %d accounts locked 0.2–1.5 s; throughput after: %.0f %% %s",
			len(abandoned), locks.Load(), 100*kept, map[bool]string{true: "of before", false: "of its twin's (paired)"}[paired == ""]),
		duplicates: end.audit.duplicateCharges,
		lost:       end.lost(),
		violations: end.violations(),
		command:    reproduce("TestAbandoningClients"),
	}.log(t, time.Since(s.began))
}

// sendHalfAndClose sends o's headers and half its body on a connection of
// its own and closes it: the service never reads a whole request.
func sendHalfAndClose(addr, apiKey string, o op) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: payments\r\nAuthorization: Bearer %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", o.path, apiKey, o.key, len(o.body), o.body[:len(o.body)/2])
}

// leave sends o and gives up on it after d, closing its connection.
func leave(client *http.Client, base, apiKey string, o op, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+o.path, strings.NewReader(string(o.body)))
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", o.key)
	if resp, err := client.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// idleMetrics are the lines of a service with no charge queued, running
// (the first two) or waiting on its key.
var idleMetrics = []string{"payments_charge_batch_age_seconds 0\n", "payments_charge_queue_length 0\n", "payments_idempotency_keys_in_flight 0\n"}

// waitFor polls cond every 20 ms until it holds; the test fails, naming
// what it waited for, when ctx ends first.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waited in vain for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var metricsListening = regexp.MustCompile(`"msg":"metrics listening","addr":"([^"]+)"`)

// scrapeService returns the service's metrics, from the METRICS_ADDR its log
// names.
func scrapeService(t *testing.T, svc *service) string {
	t.Helper()
	found := metricsListening.FindAllStringSubmatch(svc.logs.String(), -1)
	if len(found) == 0 {
		t.Fatal("the service did not log its metrics address")
	}
	resp, err := http.Get("http://" + found[len(found)-1][1] + "/metrics")
	must(t, err, "scrape the metrics")
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err, "read the metrics")
	return string(b)
}

var failedAbandoned = regexp.MustCompile(`\{[^\n]*"msg":"charge abandoned by its client"[^\n]*"outcome":"failed"[^\n]*`)

var abandonedSeries = regexp.MustCompile(`payments_charges_abandoned_total\{outcome="([a-z_]+)"\} ([0-9]+)`)

// abandonedCounts reads payments_charges_abandoned_total by outcome.
func abandonedCounts(metrics string) map[string]int {
	out := map[string]int{}
	for _, m := range abandonedSeries.FindAllStringSubmatch(metrics, -1) {
		var n int
		_, _ = fmt.Sscan(m[2], &n)
		out[m[1]] = n
	}
	return out
}
