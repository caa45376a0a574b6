package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// benchSettings are make bench's knobs, from the environment:
//
//	BENCH_SECONDS        seconds per scenario and for the reference (default 10)
//	BENCH_CLIENTS        concurrent clients (default 16)
//	BENCH_LOG_LEVEL      LOG_LEVEL of the service (default info, as deployed)
//	BENCH_REPORT         where to write the report (default docs/benchmarks.md)
//	BENCH_HEAP_KEYS      distinct keys for the heap target (default 200000, at least 20000)
//	BENCH_HEAP_BUDGET    seconds the heap load may take before it stops early (default 480)
//	BENCH_JANITOR_KEYS   expired keys the janitor deletes (default 1000000)
//	BENCH_LARGE          1 (default): also measure fresh with BENCH_LARGE_KEYS keys in
//	                     the table; 0 skips that (about 3 minutes)
//	BENCH_LARGE_KEYS     keys seeded for that (default 5000000)
//	BENCH_BASELINE       git ref of the service before group commit (default ac4142a);
//	                     empty, or a ref this clone lacks: no "before" column (said so
//	                     in the report and on stderr)
//	BENCH_PAIRS          rounds of the paired before/after runs (default 2)
//	BENCH_KEY_WAIT       IDEMPOTENCY_WAIT of both services in the paired runs (default
//	                     1s), so a retry of the held key answers 409 after that
//	BENCH_CURVE          1 (default): the throughput curve and its two PNGs; 0 skips it
//	BENCH_CURVE_CLIENTS  the client counts of the curve (default "1 2 4 8 16 32 64")
//	BENCH_CPU            1 (default): CPU per charge by part with the relay on and off
//	                     (make bench-pair, over 1,000 accounts and one); 0 skips it
//	BENCH_CPU_BASELINE   side A of that (default 8685d9f, the relay before its cursor
//	                     row; HEAD when this clone lacks it)
//	BENCH_CLAIM_COUNT    interleaved runs of BenchmarkKeyClaimOverhead (default 5)
//	BENCH_PROCESSOR      1 (default): card charges at the processor simulator,
//	                     answering at once and after 50 ms, against account
//	                     charges (make bench-processor; its PROC_* knobs, listed
//	                     in proc.go, apply; PROC_SECONDS defaults to
//	                     BENCH_SECONDS); 0 skips it and keeps the section the
//	                     report had
//	PAYMENTS_BENCH_DATABASE_URL, else PAYMENTS_TEST_DATABASE_URL: a PostgreSQL where
//	  this may CREATE DATABASE (default postgres://postgres@localhost:5432/postgres);
//	  the Go benchmarks create theirs there too
//	GO                   the go command (default go)
type benchSettings struct {
	seconds, clients, pairs      int
	heapKeys, heapBudget         int
	janitorKeys, largeKeys       int
	claimCount                   int
	large, curve, cpu, processor bool
	curveClients                 []int
	keyWait                      string
	baselineRef, cpuBaseline     string
	report, admin, goBin, logLvl string
}

// The defaults, which the command that reproduces a run leaves out.
const (
	defaultBaseline     = "ac4142a"
	defaultCPUBaseline  = "8685d9f"
	defaultCurveClients = "1 2 4 8 16 32 64"
)

func readBenchSettings() (benchSettings, error) {
	s := benchSettings{
		report:      benchrun.Getenv("BENCH_REPORT", "docs/benchmarks.md"),
		goBin:       benchrun.Getenv("GO", "go"),
		logLvl:      benchrun.Getenv("BENCH_LOG_LEVEL", "info"),
		baselineRef: defaultBaseline,
		cpuBaseline: defaultCPUBaseline,
		admin: benchrun.Getenv("PAYMENTS_BENCH_DATABASE_URL", benchrun.Getenv("PAYMENTS_TEST_DATABASE_URL",
			"postgres://postgres@localhost:5432/postgres?sslmode=disable")),
	}
	if v, set := os.LookupEnv("BENCH_BASELINE"); set {
		s.baselineRef = v
	}
	if v, set := os.LookupEnv("BENCH_CPU_BASELINE"); set {
		s.cpuBaseline = v
	}
	var errs []error
	number := func(p *int, name string, def, min int) {
		v, err := benchrun.PositiveInt(name, def, min)
		*p, errs = v, append(errs, err)
	}
	flag := func(p *bool, name string) {
		v, err := benchrun.Flag(name, true)
		*p, errs = v, append(errs, err)
	}
	number(&s.seconds, "BENCH_SECONDS", 10, 1)
	number(&s.clients, "BENCH_CLIENTS", 16, 1)
	number(&s.heapKeys, "BENCH_HEAP_KEYS", 200000, 20000)
	number(&s.heapBudget, "BENCH_HEAP_BUDGET", 480, 1)
	number(&s.janitorKeys, "BENCH_JANITOR_KEYS", 1000000, 1)
	number(&s.largeKeys, "BENCH_LARGE_KEYS", 5000000, 1)
	number(&s.pairs, "BENCH_PAIRS", 2, 1)
	number(&s.claimCount, "BENCH_CLAIM_COUNT", 5, 1)
	flag(&s.large, "BENCH_LARGE")
	flag(&s.curve, "BENCH_CURVE")
	flag(&s.cpu, "BENCH_CPU")
	flag(&s.processor, "BENCH_PROCESSOR")
	var err error
	s.curveClients, err = benchrun.Counts("BENCH_CURVE_CLIENTS", defaultCurveClients)
	errs = append(errs, err)
	s.keyWait, err = benchrun.Duration("BENCH_KEY_WAIT", "1s")
	errs = append(errs, err)
	return s, errors.Join(errs...)
}

// repro is the command that reproduces the run: the settings that differ
// from the defaults.
func (s benchSettings) repro() string {
	parts := []string{fmt.Sprintf("BENCH_SECONDS=%d BENCH_CLIENTS=%d", s.seconds, s.clients)}
	add := func(differs bool, setting string) {
		if differs {
			parts = append(parts, setting)
		}
	}
	add(!s.large, "BENCH_LARGE=0")
	add(s.heapKeys != 200000, fmt.Sprintf("BENCH_HEAP_KEYS=%d", s.heapKeys))
	add(s.heapBudget != 480, fmt.Sprintf("BENCH_HEAP_BUDGET=%d", s.heapBudget))
	add(s.janitorKeys != 1000000, fmt.Sprintf("BENCH_JANITOR_KEYS=%d", s.janitorKeys))
	add(s.largeKeys != 5000000, fmt.Sprintf("BENCH_LARGE_KEYS=%d", s.largeKeys))
	add(s.baselineRef != defaultBaseline, "BENCH_BASELINE="+s.baselineRef)
	add(s.pairs != 2, fmt.Sprintf("BENCH_PAIRS=%d", s.pairs))
	add(s.keyWait != "1s", "BENCH_KEY_WAIT="+s.keyWait)
	add(!s.curve, "BENCH_CURVE=0")
	add(!s.processor, "BENCH_PROCESSOR=0")
	add(joinInts(s.curveClients) != defaultCurveClients, fmt.Sprintf("BENCH_CURVE_CLIENTS='%s'", joinInts(s.curveClients)))
	return strings.Join(parts, " ")
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, " ")
}

// runBench is make bench: each step in turn, then the report. A step that
// cannot measure says so in the report; setup that fails ends the run.
func runBench(ctx context.Context, logger *log.Logger) (err error) {
	s, err := readBenchSettings()
	if err != nil {
		return err
	}
	b := &bench{log: logger, s: s, began: time.Now(), loadBefore: benchrun.LoadAverage(3)}
	defer b.cleanup()
	if err := b.setup(ctx); err != nil {
		return err
	}
	steps := []func(context.Context) error{
		b.scenarios, b.groupCommit, b.cpuByPart, b.processor, b.heap, b.janitor, b.largeTable, b.goBenchmarks,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return b.writeReport(ctx)
}
