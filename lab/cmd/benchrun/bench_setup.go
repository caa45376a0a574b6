package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// bench is one make bench run: its settings, what setup made, and what
// each step measured, for the report.
type bench struct {
	log        *log.Logger
	s          benchSettings
	began      time.Time
	loadBefore string
	shared     string
	tmp        string
	db         string // the scratch database's name; its siblings add _large, _before, _after
	scratch    string // its URL
	lg         *benchrun.Loadgen
	ref        *benchrun.Reference
	nats       *benchrun.NATS
	merchant   benchrun.Merchant
	baseline   baseline
	plotBin    string
	plotNote   string
	services   []*benchrun.Service
	databases  []string

	scen scenarioFigures
	gc   groupCommitFigures
	cpu  cpuFigures
	proc procStep
	hp   heapFigures
	jan  janitorFigures
	lt   largeFigures
	gob  goBenchFigures
}

// baseline is the service before group commit, group commit's "before".
type baseline struct {
	bin, note, commit, subject string
}

func (b *bench) say(format string, args ...any) { b.log.Printf(format, args...) }

// setup makes the scratch database, the binaries, the pgbench shim, the
// run's NATS and a merchant.
func (b *bench) setup(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(b.s.report), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll("bin", 0o755); err != nil {
		return err
	}
	removeStale()
	var err error
	if b.shared, err = benchrun.SharedDir(); err != nil {
		return err
	}
	if err := benchrun.RequireTools(b.s.goBin, "psql", "pgbench"); err != nil {
		return err
	}
	b.db = fmt.Sprintf("payments_bench_%d", os.Getpid())
	b.say("scratch database %s", b.db)
	if b.scratch, err = b.createDB(ctx, b.db); err != nil {
		return fmt.Errorf("cannot create a database with %s (%w); set PAYMENTS_BENCH_DATABASE_URL to a PostgreSQL where this user may CREATE DATABASE",
			benchrun.Redact(b.s.admin), err)
	}
	b.say("building bin/payments and bin/paymentsbench")
	if out, err := benchrun.BuildCurrent(ctx, b.s.goBin); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	if b.tmp, err = os.MkdirTemp("", "bench-"); err != nil {
		return err
	}
	b.buildBaseline(ctx)
	b.buildPlot(ctx)
	if b.ref, err = benchrun.NewReference(b.shared, b.s.seconds, b.tmp); err != nil {
		return err
	}
	results, err := benchrun.NewResults("bin/bench-results.jsonl")
	if err != nil {
		return err
	}
	b.lg = &benchrun.Loadgen{Results: results}
	switch b.nats, err = benchrun.StartNATS(ctx); {
	case errors.Is(err, benchrun.ErrNoNATSServer):
		b.say("%v", err)
	case err != nil:
		return err
	default:
		b.say("private NATS (JetStream) at %s for the relay", b.nats.URL)
	}
	b.merchant, err = benchrun.NewMerchant(ctx, "", b.scratch)
	return err
}

// removeStale removes what an earlier run left, which would otherwise mix
// with this run's logs and samples.
func removeStale() {
	for _, pattern := range []string{"bin/bench-server*.log", "bin/bench-*.err", "bin/bench-heap-*.txt",
		"bin/bench-janitor-*.txt", "bin/bench-held-*.txt", "bin/bench-go-*.txt", "bin/bench-curve.tsv"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			_ = os.Remove(f)
		}
	}
}

// createDB creates a scratch database on the admin server, dropped by
// cleanup, and returns its URL.
func (b *bench) createDB(ctx context.Context, name string) (string, error) {
	if err := benchrun.CreateDB(ctx, b.s.admin, name); err != nil {
		return "", err
	}
	b.databases = append(b.databases, name)
	return benchrun.WithDB(b.s.admin, name), nil
}

// dropDB drops a scratch database now rather than at the end.
func (b *bench) dropDB(ctx context.Context, name string) {
	_ = benchrun.DropDB(context.WithoutCancel(ctx), b.s.admin, name)
}

// start starts a service (bin/payments when bin is empty) that cleanup
// stops if the step does not.
func (b *bench) start(ctx context.Context, bin, database, logPath string, env ...string) (*benchrun.Service, error) {
	svc, err := benchrun.Start(ctx, bin, database, logPath, env...)
	if err == nil {
		b.services = append(b.services, svc)
	}
	return svc, err
}

// cleanup stops every service and NATS and drops the scratch databases.
func (b *bench) cleanup() {
	for _, svc := range b.services {
		svc.Stop()
	}
	b.nats.Stop()
	for _, name := range b.databases {
		_ = benchrun.DropDB(context.Background(), b.s.admin, name)
	}
	if b.tmp != "" {
		_ = os.RemoveAll(b.tmp)
	}
}

// buildBaseline builds BENCH_BASELINE from git archive into
// bin/payments-baseline, or notes why there is none.
func (b *bench) buildBaseline(ctx context.Context) {
	defer func() {
		if b.baseline.bin == "" {
			b.say("WARNING: no baseline, so no \"before\" column for group commit: %s", b.baseline.note)
		}
	}()
	ref := b.s.baselineRef
	if ref == "" {
		b.baseline.note = "BENCH_BASELINE is empty"
		return
	}
	commit, err := exec.CommandContext(ctx, "git", "rev-parse", "--verify", "-q", ref+"^{commit}").Output()
	if err != nil {
		b.baseline.note = fmt.Sprintf("the git ref '%s' (BENCH_BASELINE) is not in this clone (a shallow clone lacks it: git fetch --unshallow)", ref)
		return
	}
	b.baseline.commit = strings.TrimSpace(string(commit))
	subject, _ := exec.CommandContext(ctx, "git", "log", "-1", "--format=%s", b.baseline.commit).Output()
	b.baseline.subject = strings.TrimSpace(string(subject))
	b.say("building the baseline %s (%.12s) into bin/payments-baseline", ref, b.baseline.commit)
	out, err := benchrun.BuildAt(ctx, b.s.goBin, b.baseline.commit, "./cmd/payments", "bin/payments-baseline")
	_ = os.WriteFile("bin/bench-baseline-build.log", out, 0o644)
	if err != nil {
		b.baseline.note = fmt.Sprintf("building %s failed: %s", ref, firstLines(string(out), 3))
		return
	}
	b.baseline.bin = "bin/payments-baseline"
}

// buildPlot builds lab/cmd/benchplot into bin/benchplot for the curve
// (make lint and make test check it with the rest of the lab module).
func (b *bench) buildPlot(ctx context.Context) {
	if !b.s.curve {
		return
	}
	b.say("building lab/cmd/benchplot into bin/benchplot")
	out, err := benchrun.BuildLab(ctx, b.s.goBin, "benchplot", "bin/benchplot")
	_ = os.WriteFile("bin/bench-benchplot-build.log", out, 0o644)
	if err != nil {
		b.plotNote = "lab/cmd/benchplot did not build: " + firstLines(string(out), 3)
		b.say("WARNING: %s; the curve is measured but not drawn", b.plotNote)
		return
	}
	b.plotBin = "bin/benchplot"
}

// firstLines is the first n lines of s on one line.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " ")
}
