package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// failoverRun is what a failover scenario's faults act on and with: the
// cluster, the service's client, the webhook side (nil without one), and the
// account the charge after each fault goes to.
type failoverRun struct {
	sc     failoverScenario
	ctx    context.Context
	cl     *cluster
	c      *client
	hooks  *failoverHooks
	acct   string
	record func(op)
}

// strike is one fault of a scenario: the cluster as the fault found it, when
// the fault began, and the time from then to the answer of the first charge
// sent once it was done (recovery); afterEnd is the time from the fault's
// end to that answer, less than recovery by what the fault itself took
// (seconds for a stall before a kill, milliseconds for a kill alone), and
// afterCommit the time from the cluster's first commit after the fault
// (readyWatch's canary) to that answer: the service's own share, 0 when
// the charge came first.
type strike struct {
	at          settled
	began       time.Time
	recovery    time.Duration
	afterEnd    time.Duration
	afterCommit time.Duration
}

// strikeAll breaks the cluster sc.strikes times (once when unset): first on
// the whole cluster, settled, then each time on the leader and synchronous
// standby that have settled after the previous fault, the member that fault
// took maybe still on its way back. It returns the strikes, or the first
// fault's error.
func (r *failoverRun) strikeAll(t *testing.T) ([]strike, error) {
	t.Helper()
	var strikes []strike
	for i := range max(r.sc.strikes, 1) {
		s, err := r.strike(t, i == 0)
		if err != nil {
			return strikes, err
		}
		strikes = append(strikes, s)
	}
	return strikes, nil
}

// strike breaks the cluster with sc's fault once it is settled (whole: every
// member, else a leader and a synchronous standby) and the service ready,
// then drives one charge from the moment the fault is done: the time to its
// answer is the time the service could not charge. It logs the timeline of
// the recovery. It fails t when the fault left a moment with no primary
// (sc.primaryLost) that /readyz never reported, when that charge is not a
// 201, or when its answer came later than sc.within after the fault began
// or sc.withinAfterCommit after the cluster could commit again, showing the
// timeline.
func (r *failoverRun) strike(t *testing.T, whole bool) (strike, error) {
	t.Helper()
	at, began, watch, err := settleAndFault(t, r.ctx, r.cl, r.c, whole, r.hooks.whileHeld(r.sc.fault))
	if err != nil {
		watch.end()
		return strike{}, err
	}
	ended := time.Now()
	watch.steps.addAt(ended, "the fault done")
	began = r.hooks.struck(began)
	probe := drive(withAttempts(r.ctx, watch.steps.attempts("the first charge after it")), r.c,
		op{kind: "charge", path: "/v1/charges", account: r.acct, amount: 1, body: chargeBody(r.acct, 1)})
	decided := time.Now()
	watch.steps.addAt(decided, fmt.Sprintf("the first charge after it decided: %d, attempt %d", probe.answer.status, probe.attempts))
	s := strike{at: at, began: began, recovery: decided.Sub(began), afterEnd: decided.Sub(ended)}
	ready := watch.end()
	if committed, ok := watch.committedSince(ended); ok {
		s.afterCommit = max(0, decided.Sub(committed))
	}
	steps := watch.steps.from(began)
	t.Logf("timeline from the fault's start: %s", steps)
	if r.sc.primaryLost && ready[http.StatusServiceUnavailable] == 0 {
		t.Errorf("/readyz never said 503 while the primary was away: %v", ready)
	}
	if a := r.c.get(t, r.ctx, "/readyz"); a.status != http.StatusOK {
		t.Errorf("/readyz after the first charge: %d %s", a.status, a.body)
	}
	t.Logf("/readyz between the fault and the first charge after it: %v; that charge decided %v after the fault, %v after its end, %v after the cluster could commit again",
		ready, s.recovery.Round(time.Millisecond), s.afterEnd.Round(time.Millisecond), s.afterCommit.Round(time.Millisecond))
	if probe.answer.status == http.StatusCreated {
		r.record(probe)
	} else {
		t.Errorf("the first charge after the fault: %d %s", probe.answer.status, probe.answer.body)
	}
	if r.sc.within > 0 && s.recovery > r.sc.within {
		t.Errorf("the first charge after the fault was decided %v after it, later than the %v allowed; timeline from the fault's start: %s",
			s.recovery.Round(time.Millisecond), r.sc.within, steps)
	}
	if r.sc.withinAfterCommit > 0 && s.afterCommit > r.sc.withinAfterCommit {
		t.Errorf("the first charge after the fault was decided %v after the cluster could commit again, later than the %v allowed; timeline from the fault's start: %s",
			s.afterCommit.Round(time.Millisecond), r.sc.withinAfterCommit, steps)
	}
	return s, nil
}

// recoveries lists each strike's time to the first charge after it, rounded,
// and from the fault's end too where the fault lasted a second or more:
// "3.2s", "3.2s and 4.1s", or "9s (5.9s after its end)".
func recoveries(strikes []strike, round time.Duration) string {
	out := make([]string, len(strikes))
	for i, s := range strikes {
		out[i] = s.recovery.Round(round).String()
		if s.recovery-s.afterEnd >= time.Second {
			out[i] += fmt.Sprintf(" (%v after its end)", s.afterEnd.Round(round))
		}
	}
	return strings.Join(out, " and ")
}

// strikeLeaders lists the leader each strike found: "pg1" or "pg1, pg2".
func strikeLeaders(strikes []strike) string {
	out := make([]string, len(strikes))
	for i, s := range strikes {
		out[i] = s.at.leader.Name
	}
	return strings.Join(out, ", ")
}

// settleAndFault waits for a settled cluster (whole: every member) and a
// ready service (settle), starts watching /readyz and breaks the cluster with fault. When fault finds
// that the member it would break has changed role since (errMoved), it
// settles again. It returns the cluster as the fault found it, the time the
// fault began, and the watch of /readyz (to end), or fault's error.
func settleAndFault(t *testing.T, ctx context.Context, cl *cluster, c *client, whole bool,
	fault func(*testing.T, context.Context, *cluster, settled) error,
) (settled, time.Time, *readyWatch, error) {
	t.Helper()
	settleCtx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for {
		at := cl.settle(t, settleCtx, whole, func() error { return readyz(ctx, c) })
		t.Logf("settled: %v; the service is ready", at)
		watch := watchReady(ctx, c, cl)
		began := time.Now()
		err := fault(t, ctx, cl, at)
		if !errors.Is(err, errMoved) {
			return at, began, watch, err
		}
		watch.end()
		t.Logf("%v: settling again", err)
	}
}

// readyz returns nil when the service's /readyz answers 200.
func readyz(ctx context.Context, c *client) error {
	a, err := c.send(ctx, 1, http.MethodGet, "/readyz", "", nil)
	if err != nil {
		return fmt.Errorf("the service's /readyz: %w", err)
	}
	if a.status != http.StatusOK {
		return fmt.Errorf("the service's /readyz: %d %s", a.status, a.body)
	}
	return nil
}

// reproduceHA is the command that runs a failover scenario alone in the
// current mode.
func reproduceHA(test string) string {
	env := ""
	if longMode() {
		env = "CHAOS_LONG=1 "
	}
	return fmt.Sprintf("%smake chaos-ha HA_RUN='^%s$'", env, test)
}
