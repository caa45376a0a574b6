package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// TestDrain stops "payments serve" with SIGTERM under a charge load, as an
// orchestrator does, and holds it to its drain. Clients charge (each
// operation with a key of its own) before the signal and on through
// SHUTDOWN_DELAY, as they would until their load balancer has moved them; a
// prober asks /readyz every few milliseconds, as the load balancer does. The
// service's log says when it started draining and when it closed its
// listener, and every request is judged by when it was sent:
//
//   - every request sent before the listener closed got a complete answer:
//     none refused, none cut off, no 503 but /readyz's; from the drain's
//     start on each came with Connection: close;
//   - /readyz answered 503 shutting-down from the drain's start, which
//     followed the signal at once, and the listener closed SHUTDOWN_DELAY
//     later;
//   - charges whose bodies were still arriving when the listener closed
//     (in flight across the close) were answered 201 in full;
//   - connections made after the close were refused, and the process exited
//     by itself with status 0.
//
// Then the service is started again to publish what its relay had left, and
// the audit holds the ledger to the answers: balances are deposits minus
// the charges answered 201, one charge row per answered key.
func TestDrain(t *testing.T) {
	const (
		delay   = 3 * time.Second  // SHUTDOWN_DELAY
		timeout = 10 * time.Second // SHUTDOWN_TIMEOUT
		// moved is how long before the end of the delay the clients stop,
		// as their load balancer would have moved them: generous, so that
		// a slow machine does not race the close.
		moved = time.Second
	)
	var (
		workers    = scale(12, 32)
		loadBefore = scale(time.Second, 5*time.Second)
		straddlers = scale(4, 16)
		nAcct      = 8
	)
	s := startScenario(t, scale(2*time.Minute, 5*time.Minute), testDatabase, "drain")
	ctx, m := s.ctx, s.merchants[0]
	natsURL := testkit.StartNATS(t).URL()
	svc := newService(t, s.bin, serviceConfig{databaseURL: s.dbURL, natsURL: natsURL,
		// IDEMPOTENCY_WAIT above the chaos default of 2 s: a 503 for a
		// charge that waited too long for a batch on a loaded machine would
		// read as a refusal of the drain.
		extra: []string{"SHUTDOWN_DELAY=" + delay.String(), "SHUTDOWN_TIMEOUT=" + timeout.String(), "IDEMPOTENCY_WAIT=5s"}})
	c := newClient(t, m.APIKey, "drain-key-", func(int) string { return svc.url() })
	accounts := openAccounts(t, ctx, c, nAcct, 5_000_000, s.record)

	// The load, and the prober, until stopAt (set once the signal is sent).
	var stopAt atomic.Int64
	stopAt.Store(math.MaxInt64)
	running := func() bool { return time.Now().UnixNano() < stopAt.Load() && ctx.Err() == nil }
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		sent   []sentCharge
		probes []probe
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running() {
				acct := accounts[rand.IntN(len(accounts))]
				amount := 1 + rand.Int64N(500)
				sc := c.chargeOnce(ctx, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount,
					key: c.newKey(), body: chargeBody(acct, amount)})
				mu.Lock()
				sent = append(sent, sc)
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for running() {
			p := probeReadyz(ctx, svc.url())
			mu.Lock()
			probes = append(probes, p)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()

	time.Sleep(loadBefore)
	cmd, exited := svc.take()
	signalled := time.Now()
	stopAt.Store(signalled.Add(delay - moved).UnixNano())
	must(t, cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")

	// Charges in flight across the close: half the body before it, the rest
	// after it.
	var straddled []straddle
	var swg sync.WaitGroup
	time.Sleep(time.Until(signalled.Add(delay - moved)))
	closed := make(chan struct{})
	for range straddlers {
		swg.Add(1)
		go func() {
			defer swg.Done()
			acct := accounts[rand.IntN(len(accounts))]
			st := c.straddleClose(svc.addr, op{kind: "charge", path: "/v1/charges", account: acct, amount: 7,
				key: c.newKey(), body: chargeBody(acct, 7)}, closed)
			mu.Lock()
			straddled = append(straddled, st)
			mu.Unlock()
		}()
	}
	wg.Wait()
	closedAt := awaitLog(t, svc, `"msg":"closing the listener"`, delay+30*time.Second)
	time.Sleep(300 * time.Millisecond) // the listener is closed by now, not just about to be
	close(closed)
	afterClose := make([]error, 3)
	for i := range afterClose {
		resp, err := http.Get(svc.url() + "/readyz")
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		afterClose[i] = err
	}
	swg.Wait()

	select {
	case <-exited:
	case <-time.After(timeout + 30*time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		t.Fatalf("payments serve did not exit within SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT of SIGTERM; logs:\n%s", svc.logs.Tail(4000))
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("payments serve exited with status %d after SIGTERM, want 0; logs:\n%s", code, svc.logs.Tail(4000))
	}
	drainedAt := logTime(t, svc, `"msg":"shutting down`)

	v := judgeDrain(t, drainVerdictInput{signalled: signalled, drained: drainedAt, closed: closedAt, delay: delay,
		sent: sent, probes: probes, straddled: straddled, afterClose: afterClose})
	for _, sc := range sent {
		if sc.answered() {
			s.record(sc.op)
		}
	}
	for _, st := range straddled {
		if st.answered() {
			s.record(st.op)
		}
	}

	// A new process publishes what the relay had left; then the audit.
	svc.env = append(svc.env, "SHUTDOWN_DELAY=0")
	must(t, svc.start(), "restart payments serve")
	end := s.judge(t, svc, natsURL, c)
	if answered := v.charges201 + v.charges402 + v.straddled; end.audit.charges != answered {
		t.Errorf("%d charge rows, %d charges answered 201 or 402: want one row per answered key", end.audit.charges, answered)
	}
	t.Logf("%d charges sent, %d during SHUTDOWN_DELAY (%d answered 201, %d 402); %d /readyz probes (%d answered 503 shutting-down); "+
		"drain began %s after SIGTERM, listener closed %s after it; %d charges in flight across the close",
		len(sent), v.duringDelay, v.charges201, v.charges402, len(probes), v.notReady,
		drainedAt.Sub(signalled).Round(time.Millisecond), closedAt.Sub(drainedAt).Round(time.Millisecond), len(straddled))
	summary{
		scenario: "drain (SIGTERM under load)", requests: int64(len(sent) + len(probes) + len(straddled)),
		faults:     fmt.Sprintf("1 SIGTERM with %d clients charging, SHUTDOWN_DELAY %s; %d charges in flight across the close", workers, delay, len(straddled)),
		duplicates: end.audit.duplicateCharges, lost: end.lost(), violations: end.violations() + v.broken,
		command: reproduce("TestDrain"),
	}.log(t, time.Since(s.began))
}

// sentCharge is one charge sent once, with when it was sent, its answer
// (none if err) and whether the answer asked to close the connection.
type sentCharge struct {
	op
	at    time.Time
	err   error
	close bool
}

func (sc sentCharge) answered() bool {
	return sc.err == nil && (sc.answer.status == 201 || sc.answer.status == 402)
}

// chargeOnce sends o once (no retry) on c's pooled, kept-alive connections.
func (c *client) chargeOnce(ctx context.Context, o op) sentCharge {
	sc := sentCharge{op: o, at: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base(1)+o.path, bytes.NewReader(o.body))
	if err != nil {
		sc.err = err
		return sc
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", o.key)
	resp, err := c.http.Do(req) // counted by countingTransport, which reads the body whole
	if err != nil {
		sc.err = err
		return sc
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sc.answer, sc.close = answer{status: resp.StatusCode, header: resp.Header, body: b}, resp.Close
	return sc
}

// probe is one GET /readyz, as a load balancer sends it: a new connection
// each time.
type probe struct {
	at     time.Time
	status int
	code   string
	err    error
}

func probeReadyz(ctx context.Context, base string) probe {
	p := probe{at: time.Now()}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
	if err != nil {
		p.err = err
		return p
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		p.err = err
		return p
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	p.status, p.err, p.code = resp.StatusCode, err, answer{body: b}.code()
	return p
}

// straddle is a charge whose body was still arriving when the listener closed.
type straddle struct {
	op
	err  error
	done time.Time
}

func (st straddle) answered() bool { return st.err == nil && st.answer.status == 201 }

// straddleClose sends o on a connection of its own, its headers and half its
// body at once and the rest once closed is closed, and reads the answer.
func (c *client) straddleClose(addr string, o op, closed <-chan struct{}) (st straddle) {
	st.op = o
	defer func() { st.done = time.Now() }()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		st.err = err
		return st
	}
	defer conn.Close()
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n", o.path, addr, c.apiKey, o.key, len(o.body))
	half := len(o.body) / 2
	if _, err := io.WriteString(conn, head+string(o.body[:half])); err != nil {
		st.err = err
		return st
	}
	<-closed
	if _, err := conn.Write(o.body[half:]); err != nil {
		st.err = err
		return st
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		st.err = err
		return st
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	st.answer, st.err = answer{status: resp.StatusCode, header: resp.Header, body: b}, err
	return st
}

// drainVerdictInput is what TestDrain saw, for judgeDrain.
type drainVerdictInput struct {
	signalled, drained, closed time.Time
	delay                      time.Duration
	sent                       []sentCharge
	probes                     []probe
	straddled                  []straddle
	afterClose                 []error
}

// drainVerdict counts what judgeDrain found.
type drainVerdict struct {
	duringDelay, charges201, charges402, notReady, straddled int
	broken                                                   int // requests refused, cut off or answered wrongly
}

// judgeDrain fails t for every request the drain mishandled, judged by when
// it was sent against the log's times of the drain's start and of the close.
func judgeDrain(t *testing.T, in drainVerdictInput) drainVerdict {
	t.Helper()
	var v drainVerdict
	fail := func(format string, args ...any) {
		t.Helper()
		if v.broken++; v.broken <= 20 {
			t.Errorf(format, args...)
		}
	}
	if d := in.drained.Sub(in.signalled); d < 0 || d > 2*time.Second {
		fail("the drain began %s after SIGTERM, want at once (at most 2 s on a loaded machine)", d)
	}
	if d := in.closed.Sub(in.drained); d < in.delay {
		fail("the listener closed %s after the drain began, before SHUTDOWN_DELAY (%s)", d, in.delay)
	}
	// Every charge sent before the listener closed, or before the end of
	// SHUTDOWN_DELAY if the listener closed earlier than it should have.
	promised := in.drained.Add(in.delay)
	for _, sc := range in.sent {
		inTime := sc.at.Before(in.closed) || sc.at.Before(promised)
		switch {
		case !inTime && sc.err != nil && !errors.Is(sc.err, syscall.ECONNREFUSED):
			fail("a charge sent after the listener closed was cut off: %v, want an answer or connection refused", sc.err)
		case !inTime:
			continue // after the close and the delay: refused, or answered (accepted just before)
		case sc.err != nil:
			fail("a charge sent %s the end of SHUTDOWN_DELAY (%s the listener closed) got no answer: %v",
				relative(sc.at, promised), relative(sc.at, in.closed), sc.err)
		case !sc.answered():
			fail("a charge sent %s the end of SHUTDOWN_DELAY: %d %s", relative(sc.at, promised), sc.answer.status, sc.answer.body)
		case sc.answer.status == 201:
			v.charges201++
		default:
			v.charges402++
		}
		if sc.at.After(in.drained) {
			v.duringDelay++
			if sc.err == nil && !sc.close {
				fail("a charge sent during the drain was answered without Connection: close")
			}
		}
	}
	if v.duringDelay < 10 {
		fail("only %d charges were sent during SHUTDOWN_DELAY: the load did not go on", v.duringDelay)
	}
	judgeProbes(in, &v, fail)
	for _, st := range in.straddled {
		if st.answered() {
			v.straddled++
		}
		if !st.answered() || !st.done.After(in.closed) {
			fail("a charge in flight across the close: %d %s (%v), finished %s the close, want 201 after it",
				st.answer.status, st.answer.body, st.err, relative(st.done, in.closed))
		}
	}
	for _, err := range in.afterClose {
		if !errors.Is(err, syscall.ECONNREFUSED) {
			fail("a connection after the listener closed: %v, want connection refused", err)
		}
	}
	return v
}

// judgeProbes holds the /readyz probes to the drain: 200 before the signal
// (at least once), answered every time, 503 shutting-down from the drain's
// start on.
func judgeProbes(in drainVerdictInput, v *drainVerdict, fail func(string, ...any)) {
	var readyBefore int
	for _, p := range in.probes {
		switch {
		case p.err != nil:
			fail("a /readyz probe sent %s the listener closed got no answer: %v", relative(p.at, in.closed), p.err)
		case p.at.After(in.drained) && (p.status != http.StatusServiceUnavailable || p.code != "shutting-down"):
			fail("a /readyz probe sent during the drain: %d %s, want 503 shutting-down", p.status, p.code)
		case p.at.After(in.drained):
			v.notReady++
		case p.at.Before(in.signalled) && p.status == http.StatusOK:
			readyBefore++
		}
	}
	if readyBefore == 0 || v.notReady == 0 {
		fail("/readyz: %d probes ready before SIGTERM, %d not ready during the drain; want some of each", readyBefore, v.notReady)
	}
}

// awaitLog waits up to bound for svc's log to hold a line containing s, and
// returns the line's time.
func awaitLog(t *testing.T, svc *service, s string, bound time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !strings.Contains(svc.logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in the log after %s:\n%s", s, bound, svc.logs.Tail(4000))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return logTime(t, svc, s)
}

// logTime returns the time of svc's last log line containing s.
func logTime(t *testing.T, svc *service, s string) time.Time {
	t.Helper()
	lines := strings.Split(svc.logs.String(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], s) {
			continue
		}
		var l struct{ Time time.Time }
		must(t, json.Unmarshal([]byte(lines[i]), &l), "log line %q", lines[i])
		return l.Time
	}
	t.Fatalf("no %s in the log:\n%s", s, svc.logs.Tail(4000))
	return time.Time{}
}

// relative says when at was, seen from ref: "27ms before" or "3ms after".
func relative(at, ref time.Time) string {
	if d := ref.Sub(at).Round(time.Millisecond); d >= 0 {
		return d.String() + " before"
	}
	return at.Sub(ref).Round(time.Millisecond).String() + " after"
}
