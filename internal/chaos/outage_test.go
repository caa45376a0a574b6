package chaos_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// TestDatabaseOutage cuts the database off under load: the proxy between the
// service and PostgreSQL drops every connection and refuses new ones, then
// comes back. While it is down every answer is a 503 service-unavailable
// problem with Retry-After (or a replay) and /readyz says 503; when it is back
// the same process recovers by itself, and the clients' retries leave no
// duplicate charge and balances that add up. The relay runs inside the
// service, so the events of the outage's survivors must all reach JetStream.
func TestDatabaseOutage(t *testing.T) {
	var (
		cuts     = scale(2, 10)
		down     = scale(1500*time.Millisecond, 4*time.Second)
		up       = scale(1500*time.Millisecond, 3*time.Second)
		nWorkers = scale(4, 16)
		pace     = scale(20*time.Millisecond, 5*time.Millisecond) // between a worker's charges
		nAcct    = 4
	)
	s := startScenario(t, scale(90*time.Second, 10*time.Minute), testDatabase, "outage")
	ctx, bin, dbURL, m := s.ctx, s.bin, s.dbURL, s.merchants[0]
	proxy, proxied := newProxy(t, dbURL)
	natsURL := testkit.StartNATS(t).URL()
	svc := newService(t, bin, serviceConfig{databaseURL: proxied, natsURL: natsURL})
	c := newClient(t, m.APIKey, "outage-key-", func(int) string { return svc.url() })

	var (
		mu       sync.Mutex // guards the tallies below
		accounts []string
	)
	for range nAcct {
		acct := c.mustAccount(t, ctx, usd)
		accounts = append(accounts, acct)
		s.record(drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
			amount: 50_000_000, body: []byte(`{"amount":50000000}`)}))
	}

	// While the database is cut off, every answer to a request sent after the
	// cut and answered before the restore must say so.
	var (
		cutSince    atomic.Int64 // UnixNano of the current cut, 0 while up
		duringCut   = map[string]int{}
		wrongInCut  int
		unresolved  atomic.Int64
		stopWorkers = make(chan struct{})
		wg          sync.WaitGroup
	)
	observe := func(sent time.Time, a answer, err error) {
		since := cutSince.Load()
		if since == 0 || sent.UnixNano() < since || cutSince.Load() != since {
			return // not entirely inside one cut
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			duringCut["no answer"]++
			wrongInCut++
		case a.status == http.StatusServiceUnavailable && a.code() == "service-unavailable" && a.header.Get("Retry-After") != "":
			duringCut["503 service-unavailable"]++
		case a.replayed():
			duringCut["replay"]++
		default:
			duringCut[fmt.Sprint(a.status, " ", a.code())]++
			wrongInCut++
		}
	}
	for range nWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stopWorkers:
					return
				default:
				}
				acct := accounts[rand.IntN(len(accounts))]
				amount := 1 + rand.Int64N(1000)
				o := op{kind: "charge", path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount), key: c.newKey()}
				for attempt := 1; attempt <= maxAttempts && ctx.Err() == nil; attempt++ {
					sent := time.Now()
					a, err := c.send(ctx, attempt, http.MethodPost, o.path, o.key, o.body)
					observe(sent, a, err)
					if err == nil && !c.retryable(a) {
						o.answer, o.attempts = a, attempt
						break
					}
					time.Sleep(20*time.Millisecond + rand.N(30*time.Millisecond))
				}
				if o.answer.status == 0 {
					unresolved.Add(1)
				}
				time.Sleep(pace)
				s.record(o)
			}
		}()
	}

	// The outages, with /readyz watched throughout.
	readyz := func() int {
		a, err := c.send(ctx, 1, http.MethodGet, "/readyz", "", nil)
		if err != nil {
			return 0
		}
		return a.status
	}
	var (
		readyDuringCut                = map[int]int{}
		worstReady, worstCharge       time.Duration
		notRecovered, notReadyReports int
	)
	for i := range cuts {
		time.Sleep(up)
		proxy.cut()
		cutSince.Store(time.Now().UnixNano())
		for end := time.Now().Add(down); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			readyDuringCut[readyz()]++
		}
		cutSince.Store(0)
		must(t, proxy.restore(), "restore the database")
		restored := time.Now()

		// Recovery without a restart: /readyz and a fresh charge succeed.
		// The probe charge keeps its key until it is answered, like any client.
		var readyAfter, chargeAfter time.Duration
		probe := op{kind: "charge", path: "/v1/charges", account: accounts[0], amount: 1, body: chargeBody(accounts[0], 1), key: c.newKey()}
		for deadline := restored.Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if readyAfter == 0 && readyz() == http.StatusOK {
				readyAfter = time.Since(restored)
			}
			if chargeAfter == 0 {
				a, err := c.send(ctx, 1, http.MethodPost, probe.path, probe.key, probe.body)
				if err == nil && a.status == http.StatusCreated {
					chargeAfter = time.Since(restored)
					probe.answer = a
					s.record(probe)
				}
			}
			if readyAfter > 0 && chargeAfter > 0 {
				break
			}
		}
		if readyAfter == 0 || chargeAfter == 0 {
			notRecovered++
			t.Errorf("outage %d: not recovered 30 s after the restore (ready after %v, charged after %v)", i, readyAfter, chargeAfter)
		}
		worstReady, worstCharge = max(worstReady, readyAfter), max(worstCharge, chargeAfter)
	}
	time.Sleep(up)
	close(stopWorkers)
	wg.Wait()

	for status, n := range readyDuringCut {
		if status != http.StatusServiceUnavailable {
			notReadyReports += n
			t.Errorf("/readyz answered %d %d times while the database was cut off", status, n)
		}
	}
	if wrongInCut > 0 {
		t.Errorf("answers during the outages: %v; want only 503 service-unavailable with Retry-After, or replays", duringCut)
	}
	if svc.starts != 1 {
		t.Errorf("the service was started %d times; it must recover without a restart", svc.starts)
	}

	end := s.judge(t, svc, natsURL, c)
	st := c.stats
	t.Logf("%d outages of %v: answers inside them %v, /readyz inside them %v; recovered (ready, first charge) within %v, %v; "+
		"%d operations, %d requests, %d network errors, %d 503, %d replays",
		cuts, down, duringCut, readyDuringCut, worstReady.Round(time.Millisecond), worstCharge.Round(time.Millisecond),
		len(s.recorded()), st.requests.Load(), st.netErrors.Load(), st.unavailable.Load(), st.replayed.Load())

	summary{
		scenario:   "database outage (proxy cut under load)",
		requests:   st.requests.Load(),
		faults:     fmt.Sprintf("%d cuts of %v, all connections dropped", cuts, down),
		duplicates: end.audit.duplicateCharges,
		lost:       end.lost(),
		violations: end.violations() + wrongInCut + notReadyReports + notRecovered + int(unresolved.Load()) + svc.starts - 1,
		command:    reproduce("TestDatabaseOutage"),
	}.log(t, time.Since(s.began))
}
