package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// procPhase is one of the three loads of a round.
type procPhase struct {
	name     string // as the report names it
	tag      string // in run ids and file names
	scenario string // paymentsbench's
	method   string // the payment method of the card scenario
}

// procPhases are the phases in the order of an odd round.
var procPhases = []procPhase{
	{name: "account", tag: "acct", scenario: "fresh"},
	{name: "at once", tag: "now", scenario: "card", method: "pm_card_approve"},
	{name: "slow", tag: "slow", scenario: "card", method: "pm_card_slow"},
}

// poolSeries are the service's connection pool metrics (internal/metrics
// Pool), read during each phase.
var poolSeries = []string{
	"payments_db_pool_acquired_conns", "payments_db_pool_max_conns", "payments_db_pool_acquires_total",
	"payments_db_pool_empty_acquires_total", "payments_db_pool_acquire_wait_seconds_total",
}

// poolInterval is how often the pool is read during a phase.
const poolInterval = 200 * time.Millisecond

// setUp makes the two scratch databases and a merchant, and starts the
// simulator and the service pointed at it.
func (r *procRun) setUp(ctx context.Context) error {
	pid := os.Getpid()
	r.db, r.simDB = fmt.Sprintf("bench_proc_%d", pid), fmt.Sprintf("bench_procsim_%d", pid)
	for _, db := range []string{r.db, r.simDB} {
		if err := benchrun.CreateDB(ctx, r.admin, db); err != nil {
			return fmt.Errorf("create database %s on %s: %w", db, benchrun.Redact(r.admin), err)
		}
	}
	database := benchrun.WithDB(r.admin, r.db)
	merchant, err := benchrun.NewMerchant(ctx, r.paymentsBin, database)
	if err != nil {
		return err
	}
	r.apiKey = merchant.APIKey
	if r.sim, err = benchrun.StartSimulator(ctx, r.simBin, benchrun.WithDB(r.admin, r.simDB),
		filepath.Join(r.out, "procsim.log"), "-slow-delay", r.slowDelay); err != nil {
		return err
	}
	// The relay on and METRICS_SAMPLE as shipped (Start samples every
	// second for make bench); PROC_SERVICE_ENV comes last, so it wins.
	env := []string{"NATS_URL=" + r.natsURL, "METRICS_SAMPLE=15s", "RELAY_ENABLED=true", "PROCESSOR_URL=" + r.sim.URL}
	if r.profile {
		env = append(env, "PPROF_ADDR=127.0.0.1:0")
	}
	if r.svc, err = benchrun.Start(ctx, r.paymentsBin, database, r.serviceLog(), append(env, r.serviceEnv...)...); err != nil {
		return err
	}
	if r.profile {
		if r.prof = (&procProfiler{addr: profilerAddr(r.serviceLog())}); r.prof.addr == "" {
			return fmt.Errorf("PROC_PROFILE=1: no \"profiler listening\" line in %s", r.serviceLog())
		}
	}
	r.log.Printf("service at %s (pid %d), simulator at %s (pid %d)", r.svc.URL, r.svc.PID, r.sim.URL, r.sim.PID)
	return nil
}

// phasesPath is the file of every phase's JSON line.
func (r *procRun) phasesPath() string { return filepath.Join(r.out, "phases.jsonl") }

// serviceLog is where the service logs.
func (r *procRun) serviceLog() string { return filepath.Join(r.out, "service.log") }

// runRounds measures every phase of every round, then pg-reference, a
// round at a time.
func (r *procRun) runRounds(ctx context.Context) error {
	for round := 1; round <= r.rounds; round++ {
		order := procPhases
		if round%2 == 0 {
			order = []procPhase{procPhases[2], procPhases[1], procPhases[0]}
		}
		for _, ph := range order {
			if err := r.measurePhase(ctx, ph, round); err != nil {
				return err
			}
		}
		line, _, err := measureReference(r.shared, r.admin, r.refClients, r.seconds, r.tck, r.stderr)
		if err != nil {
			return err
		}
		r.refs = append(r.refs, line)
		r.log.Printf("round %d: pg-reference %s (tps, machine CPU ms per transaction; %d clients)", round, line, r.refClients)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// measurePhase is one phase: a CHECKPOINT, paymentsbench with the pool
// read beside it, then the wait for the relay. Its JSON line, with the
// phase, the round and the pool's figures added, goes to phases.jsonl.
func (r *procRun) measurePhase(ctx context.Context, ph procPhase, round int) error {
	if err := benchrun.Exec(ctx, r.admin, "CHECKPOINT"); err != nil {
		return err
	}
	args := []string{"-url", r.svc.URL, "-c", strconv.Itoa(r.clients), "-d", fmt.Sprintf("%ds", r.seconds),
		"-scenarios", ph.scenario, "-json", "-cpu", "-service-pid", strconv.Itoa(r.svc.PID),
		"-processor-pid", strconv.Itoa(r.sim.PID), "-run-id", fmt.Sprintf("%s%d-%d", ph.tag, round, os.Getpid())}
	if ph.method != "" {
		args = append(args, "-payment-method", ph.method)
	} else {
		args = append(args, "-accounts", strconv.Itoa(r.accounts))
	}
	poller := benchrun.StartPoller(r.svc.MetricsURL, poolInterval, poolSeries...)
	if r.prof != nil && round == 1 {
		// After the phase's setup (the account phase opens its accounts first).
		r.prof.start(ctx, r.out, ph.tag, r.seconds, r.stderr)
	}
	out, runErr := paymentsbench(ctx, r.apiKey, r.stderr, args...)
	r.prof.wait()
	readings := poller.Stop()
	res, err := parseProcLine(out)
	if err != nil {
		return fmt.Errorf("%s round %d: %w", ph.name, round, errors.Join(err, runErr))
	}
	res.Phase, res.Round, res.Load = ph.name, round, benchrun.LoadAverage(1)
	res.Pool = poolDuring(benchrun.Within(readings, res.StartUnixMs, res.EndUnixMs))
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if err := appendLine(r.phasesPath(), string(line)); err != nil {
		return err
	}
	r.phases = append(r.phases, res)
	fmt.Fprintln(r.stderr, res.progress(r.tck))
	if runErr != nil {
		return fmt.Errorf("%s round %d: %w", ph.name, round, runErr)
	}
	wait, err := r.awaitPublished(ctx)
	r.waits = append(r.waits, wait)
	return err
}

// awaitPublished waits until the service's outbox is empty (the relay has
// published every event of the phase), a minute at most, and returns the
// seconds it took.
func (r *procRun) awaitPublished(ctx context.Context) (float64, error) {
	began := time.Now()
	for time.Since(began) < time.Minute {
		v, err := benchrun.Scrape(ctx, r.svc.MetricsURL, "payments_outbox_backlog_events")
		if err == nil && v["payments_outbox_backlog_events"] == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return time.Since(began).Seconds(), nil
}

// parseProcLine reads the one JSON line of paymentsbench's output.
func parseProcLine(out []byte) (procPhaseResult, error) {
	for line := range bytes.Lines(out) {
		if bytes.HasPrefix(line, []byte("{")) {
			var res procPhaseResult
			if err := json.Unmarshal(line, &res); err != nil {
				return res, fmt.Errorf("paymentsbench's line: %w", err)
			}
			return res, nil
		}
	}
	return procPhaseResult{}, fmt.Errorf("paymentsbench gave no result")
}
