package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// groupCommitFigures: group commit's paired runs (before and after) and the
// throughput curve.
type groupCommitFigures struct {
	sides                 []string // "before" (when there is a baseline) and "after"
	oneBalance            int
	loadBefore, loadAfter string
	took                  int
	lost                  []string
	curveNote             string
	clkTck                int
}

// side is one service of the paired runs, on a database of its own.
type side struct {
	name     string
	bin      string
	database string
	merchant benchrun.Merchant
	svc      *benchrun.Service
}

// groupCommit runs the service before group commit (the baseline) and this
// checkout side by side, each on a new scratch database, with the same
// settings; their runs alternate so that drift on a shared machine falls on
// both. Runs are named groupcommit-SIDE-KIND-rROUND. Then the curve.
func (b *bench) groupCommit(ctx context.Context) error {
	g := &b.gc
	b.say("group commit: before (%s) and after (bin/payments), IDEMPOTENCY_WAIT=%s, %d round(s)",
		benchrun.OrDash(b.baseline.bin), b.s.keyWait, b.s.pairs)
	began := time.Now()
	g.loadBefore, g.clkTck = benchrun.LoadAverage(3), clockTicks()
	sides := []*side{{name: "after", bin: "bin/payments"}}
	if b.baseline.bin != "" {
		sides = []*side{{name: "before", bin: b.baseline.bin}, sides[0]}
	}
	for _, sd := range sides {
		g.sides = append(g.sides, sd.name)
		if err := b.startSide(ctx, sd); err != nil {
			return err
		}
	}
	// One account takes every charge of a run: room for 20,000 charges/s of 100.
	g.oneBalance = max(b.s.seconds*20000*100, 99999999)
	for r := 1; r <= b.s.pairs; r++ {
		order := sides
		if len(sides) == 2 && r%2 == 0 {
			order = []*side{sides[1], sides[0]}
		}
		b.groupCommitRound(ctx, r, order)
	}
	for _, sd := range sides {
		sd.svc.Stop()
	}
	if err := b.curve(ctx, sides[len(sides)-1]); err != nil {
		return err
	}
	for _, sd := range sides {
		b.dropDB(ctx, b.db+"_"+sd.name)
	}
	g.loadAfter, g.took = benchrun.LoadAverage(3), int(time.Since(began).Seconds())
	return b.ref.WriteFile("bin/bench-pgref.txt")
}

func (b *bench) startSide(ctx context.Context, sd *side) error {
	name := b.db + "_" + sd.name
	var err error
	if sd.database, err = b.createDB(ctx, name); err != nil {
		return fmt.Errorf("cannot create %s: %w", name, err)
	}
	if sd.merchant, err = benchrun.NewMerchant(ctx, sd.bin, sd.database); err != nil {
		return err
	}
	logPath := "bin/bench-server-" + sd.name + ".log"
	if sd.svc, err = b.start(ctx, sd.bin, sd.database, logPath, "IDEMPOTENCY_WAIT="+b.s.keyWait); err != nil {
		return err
	}
	b.say("  %s: %s at %s on %s (log: %s)", sd.name, sd.bin, sd.svc.URL, name, logPath)
	return nil
}

// groupCommitRound: fresh over 1,000 accounts with the service's CPU, a
// pg-reference run, fresh on one account, the same with a key held in
// flight while one more client retries it, and fresh with one client.
func (b *bench) groupCommitRound(ctx context.Context, r int, order []*side) {
	names := make([]string, len(order))
	for i, sd := range order {
		names[i] = sd.name
	}
	b.say("  round %d of %d (%s)", r, b.s.pairs, strings.Join(names, " "))
	balance := strconv.Itoa(b.gc.oneBalance)
	for _, sd := range order {
		b.pairedRun(ctx, sd, fmt.Sprintf("groupcommit-%s-fresh-r%d", sd.name, r), b.s.clients, "-service-pid", strconv.Itoa(sd.svc.PID))
	}
	if _, err := b.ref.Run(ctx, fmt.Sprintf("groupcommit-ref-r%d", r), b.s.clients, b.s.admin); err != nil {
		b.say("%v", err)
	}
	for _, sd := range order {
		b.pairedRun(ctx, sd, fmt.Sprintf("groupcommit-%s-one-r%d", sd.name, r), b.s.clients, "-accounts", "1", "-balance", balance)
		tag := fmt.Sprintf("groupcommit-%s-held-r%d", sd.name, r)
		key := fmt.Sprintf("bench-held-%d-%s-r%d", os.Getpid(), sd.name, r)
		held, err := benchrun.HoldKey(ctx, sd.database, sd.merchant.ID, key)
		if err != nil {
			b.say("%v", err)
			b.gc.lost = append(b.gc.lost, tag)
			continue
		}
		b.pairedRun(ctx, sd, tag, b.s.clients, "-accounts", "1", "-balance", balance, "-held-key", key)
		held.Release(ctx)
	}
	for _, sd := range order {
		b.pairedRun(ctx, sd, fmt.Sprintf("groupcommit-%s-single-r%d", sd.name, r), 1)
	}
}

// pairedRun is one fresh run of BENCH_SECONDS against a side's service.
func (b *bench) pairedRun(ctx context.Context, sd *side, tag string, clients int, args ...string) {
	run, err := b.lg.Fresh(ctx, tag, sd.svc.URL, sd.merchant.APIKey, clients, append([]string{"-d", b.dur()}, args...)...)
	if err != nil {
		b.say("%v", err)
		b.gc.lost = append(b.gc.lost, tag)
		return
	}
	b.say("  %s", benchrun.Summary(run))
}

// curve runs the service (restarted with the defaults on the after side's
// database) and pg-reference at each client count, one after the other,
// into bin/bench-curve.tsv, drawn by bin/benchplot.
func (b *bench) curve(ctx context.Context, after *side) error {
	if !b.s.curve {
		b.gc.curveNote = "skipped in this run (BENCH_CURVE=0)"
		return nil
	}
	b.say("  curve: fresh and pg-reference at %s clients", joinInts(b.s.curveClients))
	svc, err := b.start(ctx, "", after.database, "bin/bench-server-curve.log")
	if err != nil {
		return err
	}
	tsv := fmt.Sprintf("# series clients charges_per_s p99_ms (benchrun, %d s per point)\n", b.s.seconds)
	for _, n := range b.s.curveClients {
		tag := fmt.Sprintf("curve-c%d", n)
		if run, err := b.lg.Fresh(ctx, tag, svc.URL, after.merchant.APIKey, n, "-d", b.dur()); err == nil {
			b.say("  %s", benchrun.Summary(run))
			tsv += fmt.Sprintf("payments %d %s %s\n", n, run.Text("charges_per_s"), run.Text("p99_ms"))
		} else {
			b.say("%v", err)
			b.gc.lost = append(b.gc.lost, tag)
		}
		if ref, err := b.ref.Run(ctx, fmt.Sprintf("curve-ref-c%d", n), n, b.s.admin); err == nil {
			tsv += fmt.Sprintf("pg-reference %d %s %s\n", n, ref.TPS, ref.P99)
		} else {
			b.say("%v", err)
		}
	}
	svc.Stop()
	if err := os.WriteFile("bin/bench-curve.tsv", []byte(tsv), 0o644); err != nil {
		return err
	}
	b.drawCurve(ctx)
	return nil
}

// drawCurve draws the two PNGs beside the report, or notes why not.
func (b *bench) drawCurve(ctx context.Context) {
	if b.plotBin == "" {
		b.gc.curveNote = b.plotNote
		return
	}
	dir := filepath.Dir(b.s.report)
	m := benchrun.Describe(b.s.goBin)
	title := fmt.Sprintf("%d CPUs, %s, commit %s, %d s per point", m.CPUs, time.Now().UTC().Format("2006-01-02"), m.Revision, b.s.seconds)
	out, err := execOutput(ctx, b.plotBin, "-in", "bin/bench-curve.tsv", "-throughput", dir+"/bench-throughput.png",
		"-p99", dir+"/bench-p99.png", "-title", title)
	if err != nil {
		b.gc.curveNote = "bin/benchplot failed: " + firstLines(out, 3)
		b.say("WARNING: %s", b.gc.curveNote)
		return
	}
	b.say("  drew %s/bench-throughput.png and %s/bench-p99.png", dir, dir)
}
