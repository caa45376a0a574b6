package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// The processor's settings in TestProcessorFaults, short so that recovery
// ends within the test. The simulator and the service agree on the
// decision deadline; a call's timeout is above the simulator's slow answer
// (so a slow answer arrives) and the request's wait below it (so a slow
// charge is answered 202 first).
const (
	procDecisionDeadline = 10 * time.Second
	procCallTimeout      = 2 * time.Second
	procWait             = 800 * time.Millisecond
	procSlowDelay        = 1200 * time.Millisecond
	procFaultRate        = 0.1
)

// procRecoveryBound is how long after the traffic every card charge must be
// final (or in review): the decision deadline, past which "not found" is
// final; the lease of a call cut by a kill (a call's timeout and 5 s) before
// recovery may look at its charge; and 61 s of checks backing off from 1 s,
// doubling, capped at 30 s (1+2+4+8+16+30), for lookups and reversals that
// the simulator's faults make fail.
const procRecoveryBound = procDecisionDeadline + procCallTimeout + 5*time.Second + 61*time.Second

// TestProcessorFaults charges test cards at the card processor simulator
// through the service, while both misbehave: the simulator drops, fails
// (500, before or after processing) and delays answers at random
// (-fault-rate, seeded) and is restarted; the service is SIGKILLed at random
// moments, some with calls to the processor in flight, and started again.
// Clients retry every charge with its own key (after no answer, a 5xx, a 409
// and a 202), some charges are declined, decided later by webhook
// (pm_card_async_pending) or answered slowly (pm_card_slow); captures, voids
// and refunds are asked when the service supports them for cards. Once
// recovery has resolved every charge, the simulator's audit is held against
// the service's tables and what the clients were shown: at most one
// approval per client charge, no approval the service does not hold as a
// success of its amount, no success without an approval, every charge final
// or in review within procRecoveryBound, every transition's event once.
// Then `payments reconcile` holds the ledger against the simulator's
// records: no mismatch, and, with two faults planted in our tables, exactly
// those two named (procreconcile_test.go).
// CHAOS_SEED repeats a run's draws (the charges, the faults' times and the
// simulator's fault sequence; not the goroutines' interleaving).
func TestProcessorFaults(t *testing.T) {
	runProcessorFaults(t, procScenario{
		name: "processor faults (simulator faulty and restarted, service SIGKILLed)",
		test: "TestProcessorFaults",
	})
}

// TestFailoverProcessorFaults is TestProcessorFaults on the HA cluster, with
// the primary's postmaster SIGKILLed once mid-traffic (Patroni promotes the
// synchronous standby) besides the service's kills and the simulator's
// restarts: a charge's processing row, confirmed by the standby before the
// call, survives the failover, and so does its outcome.
func TestFailoverProcessorFaults(t *testing.T) {
	cl := haCluster(t)
	runProcessorFaults(t, procScenario{
		name:    "failover: processor faults, primary SIGKILLed mid-traffic",
		test:    t.Name(),
		cluster: cl,
	})
}

// procScenario is a run of TestProcessorFaults: its summary's name and
// command, and the HA cluster it runs on (nil: the test server).
type procScenario struct {
	name, test string
	cluster    *cluster
}

// chaosSeed is CHAOS_SEED, or a new seed; the test logs it.
func chaosSeed(t *testing.T) uint64 {
	t.Helper()
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		must(t, err, "CHAOS_SEED")
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// procRun is a running scenario: the service, the simulator behind its
// proxy, the clients, and the faults done so far.
type procRun struct {
	sc    procScenario
	s     *scenario
	svc   *service
	sim   *procsimtest.Sim
	proxy *simProxy
	cc    *cardClients
	rng   *rand.Rand // the test goroutine's only

	kills, killsInFlight, callsAtKills, simRestarts int
	failover                                        string
}

func runProcessorFaults(t *testing.T, sc procScenario) {
	var (
		charges  = scale(300, 3000)
		workers  = scale(8, 16)
		kills    = scale(4, 30)
		restarts = scale(2, 10)
	)
	seed := chaosSeed(t)
	t.Logf("seed %d (CHAOS_SEED=%d repeats this run's draws)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	newDatabase := testDatabase
	if sc.cluster != nil {
		newDatabase = sc.cluster.newDatabase
	}
	s := startScenario(t, scale(4*time.Minute, 30*time.Minute), newDatabase, "processor-faults")
	r := &procRun{sc: sc, s: s, rng: rng, proxy: newSimProxy(t, procSlowDelay*9/10)}
	secret := "whsec_" + uuid.NewString()
	r.startService(t, secret)
	r.sim = procsimtest.Start(t, "-fault-rate", fmt.Sprint(procFaultRate), "-fault-seed", strconv.FormatUint(seed, 10),
		"-decision-deadline", procDecisionDeadline.String(), "-slow-delay", procSlowDelay.String(),
		"-webhook-url", r.svc.url()+"/v1/processor/events", "-webhook-secret", secret)
	must(t, r.proxy.up(r.sim.URL()), "proxy to the simulator")
	c := newClient(t, s.merchants[0].APIKey, "procfaults-key-", func(int) string { return r.svc.url() })
	r.cc = &cardClients{c: c, polls: 1}

	plans := planCharges(rng, charges)
	faults := planFaults(rng, charges, kills, restarts, sc.cluster != nil)
	var done atomic.Int64
	wg := r.charge(s.ctx, plans, workers, &done)
	r.strike(t, faults, &done)
	wg.Wait()
	trafficEnd, requestsInRun := time.Now(), c.stats.requests.Load()
	t.Logf("the traffic took %v", trafficEnd.Sub(s.began).Round(100*time.Millisecond))
	r.judge(t, trafficEnd, requestsInRun, len(plans))
}

// startService starts the service, its processor the simulator behind the
// proxy, and the clients.
func (r *procRun) startService(t *testing.T, secret string) {
	t.Helper()
	extra := []string{
		"PROCESSOR_URL=" + r.proxy.url(),
		"PROCESSOR_WAIT=" + procWait.String(),
		"PROCESSOR_TIMEOUT=" + procCallTimeout.String(),
		"PROCESSOR_DECISION_DEADLINE=" + procDecisionDeadline.String(),
		"PROCESSOR_WEBHOOK_SECRET=" + secret,
		"RECOVERY_INTERVAL=200ms",
		"IDEMPOTENCY_WAIT=1s",
	}
	if r.sc.cluster != nil {
		extra = append(extra, "COMMIT_WAIT=2s")
	}
	r.svc = newService(t, r.s.bin, serviceConfig{databaseURL: r.s.dbURL, extra: extra})
}

// charge starts workers clients, released together, that drive the plans
// in turn (and what each asks after a 201), counting each plan in done.
func (r *procRun) charge(ctx context.Context, plans []cardPlan, workers int, done *atomic.Int64) *sync.WaitGroup {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for i := next.Add(1) - 1; i < int64(len(plans)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				ch := r.cc.charge(ctx, plans[i])
				if ch.last().status == http.StatusCreated {
					r.cc.follow(ctx, ch)
				}
				done.Add(1)
			}
		})
	}
	close(start)
	return &wg
}

// procFault is one fault of the run, done once at charges plans are done.
type procFault struct {
	at   int64
	kind string // "kill", "restart the simulator", "failover"
}

// planFaults spreads kills and restarts over the run, each near one of
// evenly spaced points, and a failover (on a cluster) in the middle.
func planFaults(rng *rand.Rand, charges, kills, restarts int, failover bool) []procFault {
	var out []procFault
	spread := func(n int, kind string) {
		step := charges / (n + 1)
		for i := range n {
			out = append(out, procFault{at: int64((i+1)*step + rng.IntN(step) - step/2), kind: kind})
		}
	}
	spread(kills, "kill")
	spread(restarts, "restart the simulator")
	if failover {
		out = append(out, procFault{at: int64(charges / 2), kind: "failover"})
	}
	slices.SortFunc(out, func(a, b procFault) int { return int(a.at - b.at) })
	return out
}

// strike does each fault once the clients have done its share of the
// charges, in the test goroutine (procsimtest fails the test from it).
func (r *procRun) strike(t *testing.T, faults []procFault, done *atomic.Int64) {
	t.Helper()
	ctx := r.s.ctx
	for _, f := range faults {
		for done.Load() < f.at && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
		if ctx.Err() != nil {
			return
		}
		switch f.kind {
		case "kill":
			r.kill(t)
		case "restart the simulator":
			r.sim.Kill()
			r.proxy.down()
			time.Sleep(100*time.Millisecond + time.Duration(r.rng.Int64N(int64(500*time.Millisecond))))
			r.sim.Restart()
			must(t, r.proxy.up(r.sim.URL()), "proxy to the restarted simulator")
			r.simRestarts++
		case "failover":
			r.failOver(t)
		}
	}
}

// kill SIGKILLs the service and starts it again: half the time once a call
// to the processor is in flight (waiting up to half a second for one),
// else after a random pause of up to 20 ms, mid-request.
func (r *procRun) kill(t *testing.T) {
	t.Helper()
	if r.rng.IntN(2) == 0 {
		for wait := time.Now(); r.proxy.inFlight() == 0 && time.Since(wait) < 500*time.Millisecond; {
			time.Sleep(time.Millisecond)
		}
	} else {
		time.Sleep(time.Duration(r.rng.Int64N(int64(20 * time.Millisecond))))
	}
	inFlight := r.proxy.inFlight()
	must(t, r.svc.restart(), "restart the service")
	r.kills++
	if inFlight > 0 {
		r.killsInFlight++
		r.callsAtKills += inFlight
	}
}

// failOver SIGKILLs the cluster's primary once it is settled and the
// service ready, as TestFailoverPrimaryKilled does.
func (r *procRun) failOver(t *testing.T) {
	t.Helper()
	at, began, watch, err := settleAndFault(t, r.s.ctx, r.sc.cluster, r.cc.c, wholeCluster,
		func(t *testing.T, _ context.Context, _ *cluster, at settled) error {
			return killLogged(t, at.leader, "the primary")
		})
	if err != nil {
		watch.end()
		t.Fatalf("failover: %v", err)
	}
	// The first card charge sent once the primary is gone: the time to its
	// first answer (201, 402, or 202 once it is written; the simulator's
	// faults may leave its outcome to recovery) is the time the service
	// could not take a card charge.
	probe := r.cc.charge(r.s.ctx, cardPlan{method: "pm_card_approve", amount: 100, capture: true})
	ready := watch.end()
	if probe.answered.IsZero() {
		t.Fatalf("the first card charge after the failover was never answered")
	}
	took := probe.answered.Sub(began)
	r.failover = fmt.Sprintf("; SIGKILL of the primary %s's postmaster (Patroni promotes the sync standby), first card charge after %v",
		at.leader.Name, took.Round(100*time.Millisecond))
	t.Logf("/readyz between the fault and the first card charge after it: %v; that charge answered %v after the fault",
		ready, took.Round(time.Millisecond))
}

// judge waits for recovery, asks every charge left undecided again, and
// holds the simulator's audit against the service's tables and the
// clients' answers; it logs the scenario's summary.
func (r *procRun) judge(t *testing.T, trafficEnd time.Time, requestsInRun int64, planned int) {
	t.Helper()
	ctx, c, db := r.s.ctx, r.cc.c, r.s.db
	m := r.s.merchants[0]
	mid, err := uuid.Parse(m.ID)
	must(t, err, "merchant id")
	if r.sc.cluster != nil {
		settleCtx, cancel := context.WithTimeout(ctx, settleTimeout)
		r.sc.cluster.settle(t, settleCtx, wholeCluster, func() error { return readyz(ctx, c) })
		cancel()
	}
	resolved := waitResolved(t, ctx, db, mid, procRecoveryBound-time.Since(trafficEnd), r.sim.URL())
	// The simulator cancels an approval it never answered at its own
	// decision deadline, counted from the payment's creation, which a
	// re-drive may have made up to a deadline after its charge's.
	waitAnswered(t, ctx, r.sim.URL(), trafficEnd.Add(2*procDecisionDeadline+time.Second))
	stillOpen := r.cc.finish(ctx)
	for _, s := range stillOpen {
		t.Errorf("charge still undecided after recovery: %s", s)
	}
	replays := r.cc.replayAll(ctx)
	for _, s := range replays[:min(len(replays), 20)] {
		t.Errorf("replay differs: %s", s)
	}

	refs := simAudit(t, ctx, r.sim.URL())
	rows := cardRows(t, ctx, db, mid)
	audit := compareCards(t, rows, refs)
	view := viewCards(t, r.cc.all(), cardKeys(t, ctx, db, mid), rows, refs)
	leaked := logsMention(r.svc.logs.String(), c.keyPrefix, m.APIKey)
	if len(leaked) > 0 {
		t.Errorf("the service logged %q", leaked)
	}
	if len(audit.review) > 0 {
		t.Logf("%d charges in review (an operator settles them):\n%s", len(audit.review), strings.Join(audit.review, "\n"))
	}
	r.logRun(t, audit, planned, requestsInRun, resolved)
	mismatches := r.reconcile(t)
	st := c.stats
	summary{
		scenario:   r.sc.name,
		requests:   st.requests.Load(),
		faults:     r.faultsLine(),
		duplicates: audit.doubleApprovals + view.duplicates,
		lost:       audit.lost(),
		violations: audit.violations() + view.violations() + len(stillOpen) + len(replays) + len(leaked) + mismatches +
			int(st.internal.Load()+st.badProblems.Load()),
		command: r.command(),
	}.log(t, time.Since(r.s.began))
}

// logRun says what the run did and what the audit found.
func (r *procRun) logRun(t *testing.T, audit cardAudit, planned int, requestsInRun int64, resolved time.Duration) {
	t.Helper()
	byAnswer := map[int]int{}
	for _, ch := range r.cc.all() {
		byAnswer[ch.last().status]++
	}
	st, p, cc := r.cc.c.stats, r.proxy, r.cc
	refusal, _ := cc.firstRefusal.Load().(string)
	t.Logf("%d card charges planned, decided %v (0: never decided), %d answers 202, %d charges left for after recovery; "+
		"%d requests before the replay pass: %d network errors, %d 503, %d 409 in-use, %d replays; "+
		"captures, voids and refunds asked after a 201: %d done, %d refused 409 (%s), %d answered otherwise; "+
		"%d calls to the processor: %d answers dropped, %d 500s, %d slow, %d given up by the service (a kill or its timeout), "+
		"%d connections the simulator was gone for; %d kills (%d with %d calls in flight), %d simulator restarts; "+
		"every charge final %v after the traffic ended",
		planned, byAnswer, cc.accepted.Load(), cc.parked.Load(),
		requestsInRun, st.netErrors.Load(), st.unavailable.Load(), st.inUse.Load(), st.replayed.Load(),
		cc.followed.Load(), cc.unsupported.Load(), refusal, cc.followRest.Load(),
		p.calls.Load(), p.dropped.Load(), p.errors.Load(), p.slowed.Load(), p.given.Load(), p.refusals.Load(),
		r.kills, r.killsInFlight, r.callsAtKills, r.simRestarts, resolved.Round(100*time.Millisecond))
	t.Logf("audit: %s", audit)
}

// faultsLine is the summary's faults column.
func (r *procRun) faultsLine() string {
	p := r.proxy
	return fmt.Sprintf("%d SIGKILLs of `payments serve` (%d with calls to the processor in flight), %d simulator restarts; "+
		"simulator faults at rate %.2f: %d answers dropped, %d 500s, %d slow answers%s",
		r.kills, r.killsInFlight, r.simRestarts, procFaultRate, p.dropped.Load(), p.errors.Load(), p.slowed.Load(), r.failover)
}

// command reproduces the run.
func (r *procRun) command() string {
	if r.sc.cluster != nil {
		return reproduceHA(r.sc.test)
	}
	return reproduce(r.sc.test)
}
