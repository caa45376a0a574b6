package chaos_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"payments/internal/testkit"
)

// The failover scenarios: clients charge through a Patroni cluster (one
// primary, one synchronous standby, synchronous_mode_strict) while the cluster
// is broken under them, retrying every undecided request with its key, like
// TestCrash's. Afterwards, on whichever member leads: every 201 or 402 any
// client received exists under its key with the same bytes and replays them;
// one charge per key; balances add up; every event reached JetStream and the
// stream holds none that the database lost. Each reports the time from the
// fault to the first charge decided after it.

// TestFailoverPrimaryKilled: SIGKILL of the primary's postmaster; Patroni
// promotes the synchronous standby, and the old primary rejoins as standby.
func TestFailoverPrimaryKilled(t *testing.T) {
	runFailover(t, failoverScenario{
		name:        "failover: primary's postmaster SIGKILLed",
		faults:      "SIGKILL of the primary's postmaster; Patroni promotes the sync standby",
		primaryLost: true,
		fault: func(ctx context.Context, c *cluster, leader, _ member) error {
			return c.signal(ctx, leader, syscall.SIGKILL)
		},
	})
}

// TestFailoverSwitchover: a planned switchover to the synchronous standby.
func TestFailoverSwitchover(t *testing.T) {
	runFailover(t, failoverScenario{
		name:        "failover: planned switchover",
		faults:      "Patroni switchover to the sync standby",
		primaryLost: true,
		fault: func(_ context.Context, c *cluster, leader, standby member) error {
			return c.switchover(leader, standby)
		},
	})
}

// TestFailoverStandbyKilled: SIGKILL of the synchronous standby's postmaster.
// In strict mode nothing commits until Patroni has restarted it: writes answer
// 503 meanwhile, never success.
func TestFailoverStandbyKilled(t *testing.T) {
	runFailover(t, failoverScenario{
		name:   "failover: sync standby's postmaster SIGKILLed",
		faults: "SIGKILL of the sync standby's postmaster; writes wait for it (strict mode)",
		fault: func(ctx context.Context, c *cluster, _, standby member) error {
			return c.signal(ctx, standby, syscall.SIGKILL)
		},
	})
}

// TestFailoverDuringStalledReplication is the hazard of issue 15: the
// primary stops sending its write-ahead log (its walsender SIGSTOPped) while
// clients with a 1 s timeout keep retrying; commits wait for the standby, and
// a cancel reaches them (here pg_cancel_backend of every backend waiting for
// it, every 100 ms, as a DBA's watchdog or a driver that sends cancel requests
// would): PostgreSQL keeps each such commit locally and reports success with
// only a WARNING. Then the primary is SIGKILLed, walsender and all, and the
// standby is promoted without those commits. Nothing acknowledged may be
// missing, and nothing published. (statement_timeout cannot cause this:
// PostgreSQL disarms it before it commits.)
func TestFailoverDuringStalledReplication(t *testing.T) {
	runFailover(t, failoverScenario{
		name: "failover: replication stalled 3 s, commits cancelled, then primary SIGKILLed",
		faults: "primary's walsender SIGSTOPped 3 s under 1 s client timeouts, its waiting commits cancelled every 100 ms, " +
			"primary SIGKILLed",
		clientTimeout: time.Second,
		primaryLost:   true,
		// Without one, the scenario did not make the hazard it is about.
		mustLog: "commit not confirmed",
		fault: func(ctx context.Context, c *cluster, leader, _ member) error {
			group, err := c.processGroup(ctx, leader)
			if err != nil {
				return err
			}
			walsenders := walsenders(group[1:])
			if len(walsenders) == 0 {
				return fmt.Errorf("%s has no walsender among %v", leader.Name, group)
			}
			watchdog, err := pgx.Connect(ctx, c.memberURL(leader))
			if err != nil {
				return err
			}
			defer watchdog.Close(context.Background())
			if err := signalAll(walsenders, syscall.SIGSTOP); err != nil {
				return err
			}
			// A stopped process ignores everything but SIGKILL: end them,
			// also on the way out of a failure, or they would outlive
			// their postmaster and keep it from restarting.
			defer signalAll(walsenders, syscall.SIGKILL) // best effort
			for stall := time.Now(); time.Since(stall) < 3*time.Second; time.Sleep(100 * time.Millisecond) {
				if _, err := watchdog.Exec(ctx, `
SELECT pg_cancel_backend(pid) FROM pg_stat_activity
WHERE wait_event = 'SyncRep' AND application_name = 'payments'`); err != nil {
					return fmt.Errorf("cancel the waiting commits: %w", err)
				}
			}
			return signalAll(group, syscall.SIGKILL)
		},
	})
}

// walsenders picks the walsender processes out of pids, by their title.
func walsenders(pids []int) []int {
	var out []int
	for _, p := range pids {
		cmd, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		if err == nil && bytes.Contains(cmd, []byte("walsender")) {
			out = append(out, p)
		}
	}
	return out
}

// failoverScenario is one way of breaking the cluster under load.
type failoverScenario struct {
	name, faults string
	// fault breaks the cluster, whose leader and synchronous standby are
	// given, and returns once it has.
	fault func(ctx context.Context, c *cluster, leader, standby member) error
	// clientTimeout, if set, replaces the clients' 10 s timeout.
	clientTimeout time.Duration
	// primaryLost says whether the fault leaves a moment with no primary,
	// which /readyz must report.
	primaryLost bool
	// mustLog, if set, is what the service must have logged at least once.
	mustLog string
}

func runFailover(t *testing.T, sc failoverScenario) {
	cl := haCluster(t)
	checkLeaks(t)
	var (
		workers = scale(6, 12)
		nAcct   = scale(6, 20)
		before  = scale(3*time.Second, 20*time.Second) // load before the fault
		after   = scale(5*time.Second, 40*time.Second) // load once the first charge after it is decided
	)
	ctx, cancel := context.WithTimeout(context.Background(), scale(3*time.Minute, 10*time.Minute))
	defer cancel()
	began := time.Now()

	bin := buildBinary(t)
	dbURL := cl.newDatabase(t)
	m := migrateAndRegister(t, bin, dbURL, "failover")[0]
	natsURL := testkit.StartNATS(t).URL()
	svc := newService(t, bin, serviceConfig{databaseURL: dbURL, natsURL: natsURL, extra: []string{"COMMIT_WAIT=2s"}})
	c := newClient(t, m.APIKey, "failover-key-", func(int) string { return svc.url() })
	if sc.clientTimeout > 0 {
		c.http.Timeout = sc.clientTimeout
	}

	var (
		accounts []string
		mu       sync.Mutex
		ops      []op
	)
	record := func(o op) {
		mu.Lock()
		ops = append(ops, o)
		mu.Unlock()
	}
	for range nAcct {
		acct := c.mustAccount(t, ctx, usd)
		accounts = append(accounts, acct)
		o := drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
			amount: 1_000_000, body: []byte(`{"amount":1000000}`)})
		if o.answer.status != http.StatusCreated {
			t.Fatalf("opening deposit: %d %s", o.answer.status, o.answer.body)
		}
		record(o)
	}

	// The clients charge until stop closes.
	stop := make(chan struct{})
	var (
		wg         sync.WaitGroup
		unresolved atomic.Int64
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				acct := accounts[rand.IntN(len(accounts))]
				amount := 1 + rand.Int64N(500)
				o := drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: amount,
					body: chargeBody(acct, amount)})
				if o.answer.status == 0 {
					unresolved.Add(1)
					continue
				}
				record(o)
			}
		}()
	}

	// The fault, then one charge driven from the moment it is done: the time
	// to its answer is the time the service could not charge.
	time.Sleep(before)
	leader, standby := cl.waitHealthy(t, 30*time.Second)
	// /readyz, asked every 50 ms from the fault until the first charge after
	// it: it must say 503 while no primary is reachable.
	readyStop, readyDone := make(chan struct{}), make(chan map[int]int, 1)
	go func() {
		seen := map[int]int{}
		defer func() { readyDone <- seen }()
		for {
			select {
			case <-readyStop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			a, err := c.send(ctx, 1, http.MethodGet, "/readyz", "", nil)
			if err == nil {
				seen[a.status]++
			}
		}
	}()
	faultAt := time.Now()
	faultErr := sc.fault(ctx, cl, leader, standby)
	var recovery time.Duration
	if faultErr == nil {
		acct := accounts[0]
		probe := drive(ctx, c, op{kind: "charge", path: "/v1/charges", account: acct, amount: 1, body: chargeBody(acct, 1)})
		recovery = time.Since(faultAt)
		close(readyStop)
		ready := <-readyDone
		if sc.primaryLost && ready[http.StatusServiceUnavailable] == 0 {
			t.Errorf("/readyz never said 503 while the primary was away: %v", ready)
		}
		if a := c.get(t, ctx, "/readyz"); a.status != http.StatusOK {
			t.Errorf("/readyz after the first charge: %d %s", a.status, a.body)
		}
		t.Logf("/readyz between the fault and the first charge after it: %v", ready)
		if probe.answer.status == http.StatusCreated {
			record(probe)
		} else {
			t.Errorf("the first charge after the fault: %d %s", probe.answer.status, probe.answer.body)
		}
		time.Sleep(after)
	}
	close(stop)
	wg.Wait()
	if faultErr != nil {
		close(readyStop)
		<-readyDone
		t.Fatalf("fault: %v", faultErr)
	}
	newLeader, _ := cl.waitHealthy(t, 90*time.Second)
	requestsInRun := c.stats.requests.Load()

	// Every definite answer is stored and replays byte for byte.
	var unexpected, replayMismatch int
	for _, o := range ops {
		if o.answer.status != http.StatusCreated && o.answer.status != http.StatusPaymentRequired {
			unexpected++
			t.Errorf("%s %s: answered %d %s", o.kind, o.path, o.answer.status, o.answer.body)
			continue
		}
		again, _, err := c.definite(ctx, http.MethodPost, o.path, o.key, o.body)
		if err != nil || again.status != o.answer.status || !bytes.Equal(again.body, o.answer.body) || !again.replayed() {
			replayMismatch++
			if replayMismatch <= 10 {
				t.Errorf("%s %s again: %d %s (replayed %v, %v), first %d %s", o.kind, o.path,
					again.status, again.body, again.replayed(), err, o.answer.status, o.answer.body)
			}
		}
	}

	db, err := pgxpool.New(ctx, dbURL)
	must(t, err, "connect")
	t.Cleanup(db.Close)
	waitDrained(t, ctx, db)
	svc.stop()
	lostEvents, republished := compareStream(t, ctx, db, natsURL)
	a := auditDatabase(t, ctx, db, m.ID)
	a.report(t)
	broken, moneyGap := checkClientView(t, ctx, db, m.ID, ops)
	notConfirmed := strings.Count(svc.logs.String(), "commit not confirmed")
	if sc.mustLog != "" && !strings.Contains(svc.logs.String(), sc.mustLog) {
		var failures []string
		for _, line := range strings.Split(svc.logs.String(), "\n") {
			if strings.Contains(line, "request failed") && !strings.Contains(line, "context canceled") && len(failures) < 8 {
				failures = append(failures, line)
			}
		}
		t.Errorf("the service never logged %q: the fault did not make the hazard the scenario is about; it logged:\n%s",
			sc.mustLog, strings.Join(failures, "\n"))
	}
	st := c.stats
	if st.internal.Load()+st.badProblems.Load() > 0 {
		t.Errorf("%d answers were 500, %d 503/409 problems lacked their type or Retry-After", st.internal.Load(), st.badProblems.Load())
	}
	t.Logf("%d operations (%d charges), %d requests before the replay pass: %d network errors, %d 503, %d 409 in-use, "+
		"%d replays; %d commits not confirmed by the standby (answered 503); leader %s before, %s after; "+
		"first charge decided %v after the fault; %d events in the stream twice",
		len(ops), a.charges, requestsInRun, st.netErrors.Load(), st.unavailable.Load(), st.inUse.Load(),
		st.replayed.Load(), notConfirmed, leader.Name, newLeader.Name, recovery.Round(10*time.Millisecond), republished)

	summary{
		scenario:   sc.name,
		requests:   st.requests.Load(),
		faults:     sc.faults + "; first charge after " + recovery.Round(100*time.Millisecond).String(),
		duplicates: a.duplicateCharges,
		lost:       int(moneyGap) + lostEvents + a.missingEvents,
		violations: a.violations() + broken + unexpected + replayMismatch + int(unresolved.Load()) +
			int(st.internal.Load()+st.badProblems.Load()),
		command: reproduceHA(t.Name()),
	}.log(t, time.Since(began))
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
