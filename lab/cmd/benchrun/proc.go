package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// runProcessor is make bench-processor: card charges at the processor
// against account charges, in one run, written into the section "Processor
// charges: does the processor's latency limit throughput?" of
// docs/benchmarks.md, between <!-- bench-processor:begin --> and
// <!-- bench-processor:end --> (make bench runs it too, BENCH_PROCESSOR=1,
// and keeps the section as it is with BENCH_PROCESSOR=0).
//
// It builds bin/payments, bin/procsim (./cmd/procsim, the card processor
// simulator) and bin/paymentsbench from the working tree, and starts, on
// scratch databases of its own (bench_proc_PID for the service,
// bench_procsim_PID for the simulator), one simulator with -slow-delay
// PROC_SLOW_DELAY and one `payments serve` pointed at it (PROCESSOR_URL),
// the relay on and publishing to a NATS of the run's own, as shipped. Then,
// each round, three phases at PROC_CLIENTS clients, in turn (A B C, then
// C B A, so that drift falls on all three), each after a CHECKPOINT:
//
//	account   paymentsbench's fresh scenario: account charges over
//	          PROC_ACCOUNTS accounts, each request a new key
//	at once   its card scenario with pm_card_approve: the simulator answers
//	          at once
//	slow      its card scenario with pm_card_slow: the simulator answers
//	          after PROC_SLOW_DELAY
//
// each with the CPU time of the machine, the service, PostgreSQL,
// nats-server, the simulator and the load generator over the measured
// seconds (paymentsbench -cpu -service-pid -processor-pid), and the
// service's connection pool read from its /metrics every 0.2 s
// (payments_db_pool_*). After a phase it waits until the relay has
// published the outbox (60 s at most), so the next phase does not pay for
// its events. pg-reference runs once a round after the phases, at
// PROC_REF_CLIENTS (PostgreSQL's max_connections is below 256; the
// service's pool opens at most DB_MAX_CONNS). Every JSON line and log goes
// to PROC_OUT.
//
// The section gives each phase's medians over the rounds and the two
// goals, each a median of ratios taken within a round: slow charges/s ÷
// at-once charges/s ≥ 0.8 (the processor's latency does not limit
// throughput), and the service's CPU per card charge ÷ per account charge
// ≤ 2. A 1-minute load average at or above PROC_QUIET_LOAD before the run
// marks it a smoke run: its figures are not a result. Notes written by hand
// inside the section (what a profile showed, each naming its command),
// between <!-- bench-processor-notes:begin --> and its end, are kept by
// every run.
//
// Environment:
//
//	PROC_ROUNDS (3), PROC_SECONDS (10), PROC_CLIENTS (256), PROC_ACCOUNTS (1000)
//	PROC_SLOW_DELAY      the simulator's -slow-delay (default 50ms)
//	PROC_REF_CLIENTS     pg-reference's clients (default 16)
//	PROC_QUIET_LOAD      the 1-minute load average under which a run is a
//	                     result (default 1.0)
//	PROC_SERVICE_ENV     VAR=value words added to the service's environment
//	PROC_PROFILE         1: CPU profiles of the service and its goroutines
//	                     during each phase of the first round, into PROC_OUT
//	                     (proc_profile.go); such a run is a smoke run
//	PROC_OUT             where every JSON line and log goes (default a new
//	                     /tmp/bench-processor.*)
//	BENCH_REPORT         the file whose section is rewritten (default
//	                     docs/benchmarks.md; "-" writes none)
//	PAYMENTS_BENCH_DATABASE_URL, else PAYMENTS_TEST_DATABASE_URL: a
//	                     PostgreSQL where this may CREATE DATABASE (default
//	                     postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
//	GO                   the go command (default go)
func runProcessor(ctx context.Context, logger *log.Logger) error {
	s, err := readProcSettings(0)
	if err != nil {
		return err
	}
	// Before the builds, whose own load would count as another's.
	s.loadBefore = benchrun.LoadAverage(3)
	if err := buildProcessor(ctx, s.goBin, os.Stderr); err != nil {
		return err
	}
	nats, err := benchrun.StartNATS(ctx)
	switch {
	case errors.Is(err, benchrun.ErrNoNATSServer):
		logger.Print(err)
	case err != nil:
		return err
	default:
		logger.Printf("private NATS (JetStream) at %s for the relay", nats.URL)
	}
	defer nats.Stop()
	outcome, err := measureProcessor(ctx, s, logger, os.Stderr)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted (%w); cleaned up", err)
		}
		return err
	}
	if s.report != "-" {
		if err := writeProcSection(s.report, outcome.Section); err != nil {
			return fmt.Errorf("write %s: %w", s.report, err)
		}
		logger.Printf("wrote the section of %s", s.report)
	}
	fmt.Print(outcome.Section)
	return nil
}

// measureProcessor measures with s, each phase's progress and
// paymentsbench's messages to stderr, and returns the section and its
// goals; it stops what it started and drops its databases on every return.
func measureProcessor(ctx context.Context, s procSettings, logger *log.Logger, stderr io.Writer) (procOutcome, error) {
	r, err := newProcRun(s, logger, stderr)
	if err != nil {
		return procOutcome{}, err
	}
	defer r.cleanup(ctx)
	if err := r.setUp(ctx); err != nil {
		return procOutcome{}, err
	}
	if err := r.runRounds(ctx); err != nil {
		return procOutcome{}, err
	}
	return r.section(ctx)
}

// buildProcessor builds the service, the simulator and the load generator
// from the working tree, their messages to log.
func buildProcessor(ctx context.Context, goBin string, log io.Writer) error {
	out, err := benchrun.BuildCurrent(ctx, goBin)
	_, _ = log.Write(out)
	if err != nil {
		return err
	}
	out, err = benchrun.BuildAt(ctx, goBin, "", "./cmd/procsim", procsimBin)
	_, _ = log.Write(out)
	if err != nil {
		return fmt.Errorf("build %s: %w", procsimBin, err)
	}
	return nil
}

// procsimBin is where the simulator is built.
const procsimBin = "bin/procsim"

// procSettings are what a run of bench-processor measures, and where.
type procSettings struct {
	rounds, seconds, clients, accounts, refClients int
	slowDelay                                      string
	quietLoad                                      float64
	serviceEnv                                     []string
	out, report, admin, goBin                      string
	// profile (PROC_PROFILE=1): profiles of the service during the first
	// round (proc_profile.go).
	profile bool
	// loadBefore is the load average (1, 5, 15 min) before the command
	// started: what else ran, which decides whether it is a smoke run.
	loadBefore string
}

// readProcSettings reads the environment; seconds, when not 0, is the
// default of PROC_SECONDS (make bench's BENCH_SECONDS). It fails on a
// malformed value.
func readProcSettings(seconds int) (procSettings, error) {
	s := procSettings{
		out:    os.Getenv("PROC_OUT"),
		report: benchrun.Getenv("BENCH_REPORT", "docs/benchmarks.md"),
		goBin:  benchrun.Getenv("GO", "go"),
		admin: benchrun.Getenv("PAYMENTS_BENCH_DATABASE_URL", benchrun.Getenv("PAYMENTS_TEST_DATABASE_URL",
			"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")),
		serviceEnv: strings.Fields(os.Getenv("PROC_SERVICE_ENV")),
	}
	var errs []error
	number := func(p *int, name string, def int) {
		v, err := benchrun.PositiveInt(name, def, 1)
		*p, errs = v, append(errs, err)
	}
	number(&s.rounds, "PROC_ROUNDS", 3)
	number(&s.seconds, "PROC_SECONDS", cmp.Or(seconds, 10))
	number(&s.clients, "PROC_CLIENTS", 256)
	number(&s.accounts, "PROC_ACCOUNTS", 1000)
	number(&s.refClients, "PROC_REF_CLIENTS", 16)
	var err error
	s.slowDelay, err = benchrun.Duration("PROC_SLOW_DELAY", "50ms")
	errs = append(errs, err)
	s.profile, err = benchrun.Flag("PROC_PROFILE", false)
	errs = append(errs, err)
	s.quietLoad = 1.0
	if v := os.Getenv("PROC_QUIET_LOAD"); v != "" {
		if s.quietLoad, err = strconv.ParseFloat(v, 64); err != nil || s.quietLoad <= 0 {
			errs = append(errs, fmt.Errorf("PROC_QUIET_LOAD must be a positive number, got %q", v))
		}
	}
	for _, w := range s.serviceEnv {
		if k, _, ok := strings.Cut(w, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("PROC_SERVICE_ENV must be VAR=value words, got %q", w))
		}
	}
	return s, errors.Join(errs...)
}

// repro is the command that reproduces the run: the settings that differ
// from the defaults.
func (s procSettings) repro() string {
	parts := []string{fmt.Sprintf("PROC_ROUNDS=%d PROC_SECONDS=%d", s.rounds, s.seconds)}
	add := func(differs bool, setting string) {
		if differs {
			parts = append(parts, setting)
		}
	}
	add(s.clients != 256, fmt.Sprintf("PROC_CLIENTS=%d", s.clients))
	add(s.accounts != 1000, fmt.Sprintf("PROC_ACCOUNTS=%d", s.accounts))
	add(s.refClients != 16, fmt.Sprintf("PROC_REF_CLIENTS=%d", s.refClients))
	add(s.slowDelay != "50ms", "PROC_SLOW_DELAY="+s.slowDelay)
	add(len(s.serviceEnv) > 0, fmt.Sprintf("PROC_SERVICE_ENV='%s'", strings.Join(s.serviceEnv, " ")))
	add(s.profile, "PROC_PROFILE=1")
	return strings.Join(append(parts, "make bench-processor"), " ")
}

// procRun is one run: what it started, so that cleanup stops it, and what
// it measured.
type procRun struct {
	procSettings
	log        *log.Logger
	stderr     io.Writer
	shared     string
	tck        int
	began      time.Time
	loadBefore string
	natsURL    string

	paymentsBin, simBin string // bin/payments, bin/procsim
	db, simDB           string // the scratch databases' names while they exist
	apiKey              string
	sim                 *benchrun.Simulator
	svc                 *benchrun.Service
	prof                *procProfiler // with PROC_PROFILE=1

	phases []procPhaseResult // every measurement, in the order taken
	refs   []string          // pg-reference's "tps ms", a round
	waits  []float64         // seconds the relay took to publish a phase's backlog
}

// newProcRun checks the tools and makes the directory of the results.
func newProcRun(s procSettings, logger *log.Logger, stderr io.Writer) (*procRun, error) {
	r := &procRun{procSettings: s, log: logger, stderr: stderr, tck: clockTicks(), began: time.Now(),
		paymentsBin: "bin/payments", simBin: procsimBin,
		loadBefore: cmp.Or(s.loadBefore, benchrun.LoadAverage(3)), natsURL: benchrun.Getenv("NATS_URL", defaultNATSURL)}
	var err error
	if r.shared, err = benchrun.SharedDir(); err != nil {
		return nil, err
	}
	if err := benchrun.RequireTools(r.goBin, "psql", "pgbench"); err != nil {
		return nil, err
	}
	if r.out == "" {
		if r.out, err = os.MkdirTemp("", "bench-processor."); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(r.out, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(r.phasesPath(), nil, 0o644); err != nil {
		return nil, err
	}
	r.log.Printf("%d rounds of %d s at %d clients, the simulator's slow delay %s; load average %s; results in %s",
		s.rounds, s.seconds, s.clients, s.slowDelay, r.loadBefore, r.out)
	return r, nil
}

// cleanup stops the service and the simulator and drops their databases,
// within a minute whether or not ctx was cancelled.
func (r *procRun) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	r.svc.Stop()
	r.svc = nil
	r.sim.Stop()
	r.sim = nil
	for _, db := range []*string{&r.db, &r.simDB} {
		if *db == "" {
			continue
		}
		if err := benchrun.DropDB(ctx, r.admin, *db); err != nil {
			r.log.Printf("could not drop %s: %v", *db, err)
		}
		*db = ""
	}
}
