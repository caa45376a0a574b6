package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// sideView: one side's figures of group commit, each the mean over the rounds.
type sideView struct {
	Runs                            int
	FreshCPS, OneCPS, SingleP50     string
	OneP99, HeldP99, HeldRatio, CPU string
	HeldAnswers                     string
}

// groupCommitView: group commit's table, its verdicts, and the runs.
type groupCommitView struct {
	Before, After           sideView
	RefTPS, RefP50At1       string
	SingleRatio, CPURatio   string
	SingleResult, CPUResult string
	HeldResult              string
	FreshVs, OneVs          string
	BeforeDesc              string
	HeldBeforeMissed        bool
	HeldBeforeErrors        int
	Runs                    []string
	RefRuns                 []benchrun.RefRun
	CurveRows               []string
	Lost                    string
}

func (b *bench) side(name string) sideView {
	rs := b.lg.Results
	mean := func(field, kind string, digits int) string {
		m, ok := benchrun.Mean(benchrun.Floats(rs.Match(fmt.Sprintf("groupcommit-%s-%s-r[0-9]+", name, kind)), field))
		return benchrun.FixedOr(m, ok, digits)
	}
	fresh := rs.Match(fmt.Sprintf("groupcommit-%s-fresh-r[0-9]+", name))
	v := sideView{Runs: len(benchrun.Floats(fresh, "charges")), FreshCPS: mean("charges_per_s", "fresh", 1),
		OneCPS: mean("charges_per_s", "one", 1), SingleP50: mean("p50_ms", "single", 3),
		OneP99: mean("p99_ms", "one", 3), HeldP99: mean("p99_ms", "held", 3)}
	if v.HeldP99 != "" {
		v.HeldRatio = benchrun.Ratio(v.HeldP99, v.OneP99, 2)
	}
	ticks, charges := benchrun.Floats(fresh, "service_cpu_ticks"), benchrun.Sum(benchrun.Floats(fresh, "charges"))
	if len(ticks) > 0 && charges > 0 {
		v.CPU = benchrun.Fixed(benchrun.Sum(ticks)*1000/float64(b.gc.clkTck)/charges, 3)
	}
	answers := map[string]int64{}
	for _, r := range rs.Match(fmt.Sprintf("groupcommit-%s-held-r[0-9]+", name)) {
		for status, n := range r.CountMap("held_key_statuses") {
			answers[status] += n
		}
	}
	var parts []string
	for status, n := range answers {
		parts = append(parts, fmt.Sprintf("%s: %d", status, n))
	}
	sort.Strings(parts)
	v.HeldAnswers = strings.Join(parts, ", ")
	return v
}

// HeldCell is "p99 X ms held vs Y ms not (Z ×); the retrying client: ...".
func (v sideView) HeldCell() string {
	if v.HeldP99 == "" {
		return "—"
	}
	return fmt.Sprintf("%s ms held vs %s ms not (%s ×); the retrying client: %s", v.HeldP99, v.OneP99, v.HeldRatio, benchrun.OrDash(v.HeldAnswers))
}

// withRatio is "VALUE SUFFIX (VALUE/OF ×)", or a dash when VALUE is empty.
func withRatio(value, of, suffix string) string {
	if value == "" {
		return "—"
	}
	if suffix != "" {
		suffix = " " + suffix
	}
	if of == "" {
		return value + suffix
	}
	return fmt.Sprintf("%s%s (%s ×)", value, suffix, benchrun.Ratio(value, of, 2))
}

// orDashWith is "VALUE MORE", or an em dash when VALUE is empty.
func orDashWith(value, more string) string {
	if value == "" {
		return "—"
	}
	if more == "" {
		return value
	}
	return value + " " + more
}

func (b *bench) groupCommitView() groupCommitView {
	v := groupCommitView{Before: b.side("before"), After: b.side("after"), Lost: strings.Join(b.gc.lost, " ")}
	refs := b.ref.Match("groupcommit-ref-r[0-9]+")
	var tps []float64
	for _, r := range refs {
		if r.TPS != "" {
			tps = append(tps, r.TPSValue)
		}
	}
	m, ok := benchrun.Mean(tps)
	v.RefTPS = benchrun.FixedOr(m, ok, 1)
	v.RefP50At1 = b.ref.Get("curve-ref-c1").P50
	v.judge(b)
	v.BeforeDesc = b.beforeDesc()
	for _, r := range b.lg.Results.Match("(groupcommit|curve)-.*") {
		v.Runs = append(v.Runs, r.Name)
	}
	v.RefRuns = b.ref.Match("(groupcommit|curve)-.*")
	for _, n := range b.s.curveClients {
		run, ref := b.lg.Results.Get(fmt.Sprintf("curve-c%d", n)), b.ref.Get(fmt.Sprintf("curve-ref-c%d", n))
		v.CurveRows = append(v.CurveRows, fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s | %s |", n,
			benchrun.OrDash(run.Text("charges_per_s")), benchrun.OrDash(run.Text("p50_ms")), benchrun.OrDash(run.Text("p99_ms")),
			benchrun.OrDash(ref.TPS), benchrun.OrDash(ref.P50), benchrun.OrDash(ref.P99),
			benchrun.Ratio(run.Text("charges_per_s"), ref.TPS, 2)))
	}
	return v
}

// judge works out group commit's verdicts; without a baseline, those that
// compare with it are not judged.
func (v *groupCommitView) judge(b *bench) {
	before, after := v.Before, v.After
	v.HeldResult = "not measured"
	if after.HeldRatio != "" {
		v.HeldResult = benchrun.AtMost(after.HeldRatio, 1.5)
	}
	if before.HeldRatio != "" && benchrun.AtMost(before.HeldRatio, 1.5) == "**not met**" {
		v.HeldBeforeMissed = true
		errs := benchrun.Sum(benchrun.Floats(b.lg.Results.Match("groupcommit-before-held-r[0-9]+"), "error_count"))
		v.HeldBeforeErrors = int(errs)
	}
	if b.baseline.bin == "" {
		v.SingleResult = "not measured: no baseline (" + b.baseline.note + ")"
		v.CPUResult = v.SingleResult
		return
	}
	v.SingleRatio = benchrun.Ratio(after.SingleP50, before.SingleP50, 2)
	v.CPURatio = benchrun.Ratio(after.CPU, before.CPU, 2)
	v.SingleResult, v.CPUResult = "not measured", "not measured"
	if after.SingleP50 != "" && before.SingleP50 != "" {
		v.SingleResult = benchrun.AtMost(v.SingleRatio, 1.2)
	}
	if after.CPU != "" && before.CPU != "" {
		v.CPUResult = benchrun.AtMost(v.CPURatio, 0.5)
	}
	v.FreshVs = " (after ÷ before " + benchrun.Ratio(after.FreshCPS, before.FreshCPS, 2) + " ×)"
	v.OneVs = " (after ÷ before " + benchrun.Ratio(after.OneCPS, before.OneCPS, 2) + " ×)"
}

func (b *bench) beforeDesc() string {
	if b.baseline.bin == "" {
		return "**before**: not measured in this run: " + b.baseline.note +
			". Every before figure below is a dash and every target that compares with it is not judged"
	}
	return fmt.Sprintf("**before**: `payments serve` built from BENCH_BASELINE=%s (%.12s, \"%s\"): a fresh charge is one SQL statement, no group commit",
		b.s.baselineRef, b.baseline.commit, b.baseline.subject)
}
