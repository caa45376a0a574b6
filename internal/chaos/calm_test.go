package chaos_test

import (
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// TestOutageLogsCalmly cuts the database off for 15 s (2 minutes in the long
// mode) under "payments serve" and "payments relay", run as separate
// processes, while a prober asks /readyz every second and a client charges
// now and then. Each process writes at most 5 WARN or ERROR lines per minute
// of outage, and at least 5 in all, however often it is probed or tried:
// each retry loop logs the outage when it begins and once a minute while it
// goes on, not each attempt. The relay's backoff ceiling grows to its cap
// (5 s); in the long mode more than five of its waits exceed half of it.
// After the restore everything recovers without a restart (/readyz 200, a
// charge, the relay publishing), each loop that logged the outage logs one
// INFO line when it is back, and the audit (judge) finds every event in the
// stream and the tables whole.
func TestOutageLogsCalmly(t *testing.T) {
	var (
		down  = scale(15*time.Second, 2*time.Minute)
		every = scale(2*time.Second, 5*time.Second) // between two charges
		limit = max(5, int(math.Ceil(5*down.Minutes())))
	)
	const relayCap = 5 * time.Second // relay.Options.MaxBackoff's default
	s := startScenario(t, down+3*time.Minute, testDatabase, "calm")
	ctx, m := s.ctx, s.merchants[0]
	proxy, proxied := newProxy(t, s.dbURL)
	natsURL := testkit.StartNATS(t).URL()
	// The janitor, the samplers and the expiry sweep work often enough to
	// fail in the short outage too, and to be back within the minute the
	// recovery is given (a loop on a period backs off up to four periods:
	// the sweep's default 30 s could be two minutes late); the relay runs
	// apart, logging each wait (DEBUG).
	svc := newService(t, s.bin, serviceConfig{databaseURL: proxied,
		extra: []string{"JANITOR_INTERVAL=2s", "METRICS_SAMPLE=1s", "CHARGE_EXPIRY_INTERVAL=2s"}})
	relayLogs := startRelayProcess(t, s.bin, []string{"DATABASE_URL=" + proxied, "NATS_URL=" + natsURL,
		"RELAY_POLL=100ms", "LOG_LEVEL=debug", "METRICS_ADDR=127.0.0.1:0"})
	c := newClient(t, m.APIKey, "calm-key-", func(int) string { return svc.url() })
	acct := c.mustAccount(t, ctx, usd)
	s.record(drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
		amount: 1_000_000, body: []byte(`{"amount":1000000}`)}))
	s.record(drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: 100, body: chargeBody(acct, 100)}))
	waitDrained(t, ctx, s.db)
	procs := []*watched{{name: "serve", logs: svc.logs}, {name: "relay", logs: relayLogs}}

	for _, p := range procs {
		p.from = len(p.logs.String())
	}
	proxy.cut()
	cutAt := time.Now()
	var (
		wg                sync.WaitGroup
		stop              = make(chan struct{})
		probes, charges   int
		wrongReady, wrong []string
	)
	// Every period until stop: a /readyz probe each second, and a charge now
	// and then (the first after one period: a client that was not waiting
	// for the cut), each of which must be refused.
	repeat := func(period time.Duration, now bool, do func()) {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for ; ; now = true {
			if now {
				do()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}
	wg.Go(func() {
		repeat(time.Second, true, func() {
			probes++
			if a, err := c.send(ctx, 1, http.MethodGet, "/readyz", "", nil); err != nil || a.status != http.StatusServiceUnavailable {
				wrongReady = append(wrongReady, fmt.Sprintf("%d %v", a.status, err))
			}
		})
	})
	wg.Go(func() {
		repeat(every, false, func() {
			charges++
			a, err := c.send(ctx, 1, http.MethodPost, "/v1/charges", c.newKey(), chargeBody(acct, 1))
			if err != nil || a.status != http.StatusServiceUnavailable || a.code() != "service-unavailable" {
				wrong = append(wrong, fmt.Sprintf("%d %s %v", a.status, a.body, err))
			}
		})
	})
	time.Sleep(down)
	close(stop)
	wg.Wait()
	must(t, proxy.restore(), "restore the database")
	outage := time.Since(cutAt)
	if len(wrongReady) > 0 || len(wrong) > 0 {
		t.Errorf("during the outage, /readyz answered %v and charges %v; want 503 service-unavailable", wrongReady, wrong)
	}

	recovered := recoverAfterOutage(t, s, c, acct, procs)
	for _, p := range procs {
		p.to = len(p.logs.String())
	}
	noisy := 0
	for _, p := range procs {
		lines := p.lines(t)
		warns := testkit.Where(lines, "level", "WARN", "ERROR")
		t.Logf("%s: %d WARN/ERROR lines for an outage of %v (%d probes, %d charges), limit %d: %s",
			p.name, len(warns), outage.Round(time.Second), probes, charges, limit, summarize(warns))
		if len(warns) > limit {
			noisy++
			t.Errorf("%s wrote %d WARN/ERROR lines for an outage of %v, want at most %d:\n%s", p.name, len(warns), outage, limit, summarize(warns))
		}
		noisy += checkStateChanges(t, p.name, lines)
	}
	capped := checkRelayBackoff(t, procs[1].lines(t), relayCap)
	end := s.judge(t, svc, natsURL, c)
	summary{
		scenario:   "database outage logged calmly (serve and relay apart, /readyz each second)",
		requests:   c.stats.requests.Load(),
		faults:     fmt.Sprintf("1 cut of %v; relay waits grew to %v", down, capped),
		duplicates: end.audit.duplicateCharges,
		lost:       end.lost(),
		violations: end.violations() + len(wrongReady) + len(wrong) + noisy + recovered + svc.starts - 1,
		command:    reproduce("TestOutageLogsCalmly"),
	}.log(t, time.Since(s.began))
}

// watched is a process's log and the part of it an outage wrote: from the
// cut to the end of the recovery.
type watched struct {
	name     string
	logs     *testkit.LogBuffer
	from, to int
}

func (w *watched) lines(t *testing.T) []testkit.LogLine {
	t.Helper()
	to := w.to
	if to == 0 {
		to = len(w.logs.String())
	}
	return testkit.JSONLog(t, w.logs.String()[w.from:to], "")
}

// recoverAfterOutage waits, up to a minute, until the service is back without
// a restart (/readyz 200, a charge 201) and every loop of each process that
// logged the outage has logged its end. It returns how many of these did not
// happen.
func recoverAfterOutage(t *testing.T, s *scenario, c *client, acct string, procs []*watched) int {
	t.Helper()
	key := c.newKey() // kept until answered, as any client would
	var ready, charged bool
	deadline := time.Now().Add(time.Minute)
	for ; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if !ready {
			a, err := c.send(s.ctx, 1, http.MethodGet, "/readyz", "", nil)
			ready = err == nil && a.status == http.StatusOK
		}
		if !charged {
			o := op{kind: "charge", path: "/v1/charges", account: acct, amount: 1, body: chargeBody(acct, 1), key: key}
			a, err := c.send(s.ctx, 1, http.MethodPost, o.path, o.key, o.body)
			if charged = err == nil && a.status == http.StatusCreated; charged {
				o.answer, o.attempts = a, 1
				s.record(o)
			}
		}
		if ready && charged && len(stillDown(t, procs)) == 0 {
			return 0
		}
	}
	t.Errorf("a minute after the restore: ready %v, charged %v; loops not back: %v", ready, charged, stillDown(t, procs))
	return 1
}

// stillDown names the loops whose last state line says they are down.
func stillDown(t *testing.T, procs []*watched) []string {
	t.Helper()
	var out []string
	for _, p := range procs {
		last := map[string]any{}
		for _, ln := range testkit.Where(p.lines(t), "state", "down", "still down", "up") {
			last[ln["msg"].(string)] = ln["state"]
		}
		for msg, state := range last {
			if state != "up" {
				out = append(out, p.name+": "+msg)
			}
		}
	}
	sort.Strings(out)
	return out
}

// checkStateChanges checks each loop's story in one outage: one "down"
// (WARN), reminders ("still down", WARN) at least a minute apart, and one
// "up" (INFO) at the end. It returns how many loops broke it.
func checkStateChanges(t *testing.T, proc string, lines []testkit.LogLine) int {
	t.Helper()
	byMsg := map[string][]testkit.LogLine{}
	for _, ln := range testkit.Where(lines, "state", "down", "still down", "up") {
		byMsg[ln["msg"].(string)] = append(byMsg[ln["msg"].(string)], ln)
	}
	broken := 0
	for msg, story := range byMsg {
		ok := len(story) >= 2 && story[0]["state"] == "down" && story[len(story)-1]["state"] == "up" &&
			story[len(story)-1]["level"] == "INFO"
		var last time.Time
		for i, ln := range story {
			at, err := time.Parse(time.RFC3339Nano, ln["time"].(string))
			if err != nil || (i > 0 && i < len(story)-1 && (ln["state"] != "still down" || at.Sub(last) < 59*time.Second)) {
				ok = false
			}
			last = at
		}
		if !ok {
			broken++
			t.Errorf("%s: %q logged the outage as %s; want down, still down at most once a minute, then up (INFO)", proc, msg, summarize(story))
		}
	}
	return broken
}

// checkRelayBackoff checks that the relay's waits (its WARN and DEBUG retry
// lines) grew to capAt, the ceiling doubling from 250 ms, and never exceeded
// it; in the long mode more than five exceeded half of it. It returns the
// largest ceiling.
func checkRelayBackoff(t *testing.T, lines []testkit.LogLine, capAt time.Duration) time.Duration {
	t.Helper()
	var largest time.Duration
	var waits []string
	aboveHalf := 0
	for _, ln := range testkit.Where(lines, "msg", "relay: publish events") {
		c, err1 := time.ParseDuration(fmt.Sprint(ln["backoff_ceiling"]))
		w, err2 := time.ParseDuration(fmt.Sprint(ln["retry_in"]))
		if err1 != nil || err2 != nil {
			continue // not a retry line
		}
		if w > c || c > capAt {
			t.Errorf("relay wait %v with ceiling %v, cap %v", w, c, capAt)
		}
		largest = max(largest, c)
		if w > capAt/2 {
			aboveHalf++
		}
		waits = append(waits, w.Round(10*time.Millisecond).String()+"/"+c.String())
	}
	t.Logf("relay: %d waits (wait/ceiling): %s", len(waits), strings.Join(waits, " "))
	if largest != capAt {
		t.Errorf("the relay's backoff ceiling reached %v, want its cap %v", largest, capAt)
	}
	if longMode() && aboveHalf <= 5 {
		t.Errorf("%d of the relay's waits exceeded %v, want more than 5 in a 2-minute outage", aboveHalf, capAt/2)
	}
	return largest
}

// summarize renders log lines as "LEVEL msg (state)" with counts.
func summarize(lines []testkit.LogLine) string {
	counts := map[string]int{}
	var order []string
	for _, ln := range lines {
		k := fmt.Sprintf("%v %v", ln["level"], ln["msg"])
		if st, ok := ln["state"]; ok {
			k += fmt.Sprintf(" (%v)", st)
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	parts := make([]string, len(order))
	for i, k := range order {
		parts[i] = fmt.Sprintf("%s ×%d", k, counts[k])
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// startRelayProcess runs "payments relay" with env until the test ends
// (SIGTERM, then SIGKILL after 10 s), its output in the returned buffer.
func startRelayProcess(t *testing.T, bin string, env []string) *testkit.LogBuffer {
	t.Helper()
	logs := &testkit.LogBuffer{}
	cmd := exec.Command(bin, "relay")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.WaitDelay = 5 * time.Second
	dieWithParent(cmd)
	must(t, cmd.Start(), "start payments relay")
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
	})
	return logs
}
