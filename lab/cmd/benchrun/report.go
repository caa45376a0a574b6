package main

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"
	"unicode"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

//go:embed report.md.tmpl
var reportTemplate string

// tableHead is the head of every table of runs.
const tableHead = "| run | requests | req/s | new charges/s | replays/s | p50 ms | p95 ms | p99 ms | max ms | 409 in use | errors | balances |\n" +
	"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"

// report is what the template of docs/benchmarks.md reads: the run's
// settings, what each step measured, and the figures worked out from them.
type report struct {
	bench         *bench
	S             settingsView
	M             benchrun.Machine
	PG            string
	Shared        string
	Ref           benchrun.RefRun // pg-reference beside the scenarios
	Targets       targetsView
	GC            groupCommitView
	Go            goBenchFigures
	Heap          heapView
	JanitorSeedS  string
	CPU           cpuFigures
	CPUSection    string
	Baseline      baseline
	Took          map[string]int // seconds per step
	Warnings      string
	Elapsed       int
	Date, LoadNow string
	Kept, Sync    string
	Isolation     string // make bench-isolation's section, carried over
	// Processor is the section of processor charges: this run's, or the
	// report's (BENCH_PROCESSOR=0); Proc its goals when this run measured.
	Processor  string
	Proc       procStep
	Mismatches []string
	HeapBound  int
}

// settingsView is benchSettings for the template.
type settingsView struct {
	Seconds, Clients, Pairs, HeapKeys, HeapBudget, JanitorKeys, LargeKeys, ClaimCount int
	Large, Curve                                                                      bool
	KeyWait, BaselineRef, CurveClients, LogLevel, Repro, LoadBefore                   string
	OneBalance, ClkTck                                                                int
	GCLoadBefore, GCLoadAfter, CurveNote                                              string
}

// heapView is heapFigures for the template.
type heapView struct {
	Sent, Runs                    int
	Distinct, LoadSeconds, Errors string
	LeakMiB                       string
	Backlog, Oldest, IdleAfter    string
	RelayCPS                      string
}

func (b *bench) writeReport(ctx context.Context) error {
	r := b.newReport(ctx)
	tmpl, err := template.New("report").Funcs(template.FuncMap{
		"row": r.row, "runs": r.runs, "orDash": benchrun.OrDash, "orDashWith": orDashWith, "withRatio": withRatio,
		"ratio": benchrun.Ratio, "tableHead": func() string { return tableHead }, "loadHead": loadHead,
		"split": strings.Split,
	}).Parse(reportTemplate)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, r); err != nil {
		return err
	}
	text := withContents(strings.TrimRight(out.String(), "\n") + "\n")
	if err := os.WriteFile(b.s.report, []byte(text), 0o644); err != nil {
		return err
	}
	b.say("wrote %s in %ds: fresh/reference %s, replay/fresh %s", b.s.report, r.Elapsed, r.Targets.FreshRatio, r.Targets.ReplayRatio)
	printTargets(text)
	if len(b.lg.Failed) > 0 {
		return fmt.Errorf("balances did not match in: %s (see %s and bin/bench-results.jsonl)", strings.Join(b.lg.Failed, " "), b.s.report)
	}
	return nil
}

func (b *bench) newReport(ctx context.Context) report {
	s := b.s
	r := report{bench: b, M: benchrun.Describe(s.goBin), Shared: b.shared, Ref: b.scen.ref, Go: b.gob, CPU: b.cpu,
		Baseline: b.baseline, Warnings: b.warnings(), Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Targets: b.targetsView(), GC: b.groupCommitView(), CPUSection: strings.TrimPrefix(b.cpu.section, "\n"),
		Took: map[string]int{"gc": b.gc.took, "heap": b.hp.took, "janitor": b.jan.took, "large": b.lt.took, "processor": b.proc.took}}
	r.S = settingsView{Seconds: s.seconds, Clients: s.clients, Pairs: s.pairs, HeapKeys: s.heapKeys, HeapBudget: s.heapBudget,
		JanitorKeys: s.janitorKeys, LargeKeys: s.largeKeys, ClaimCount: s.claimCount, Large: s.large, Curve: s.curve,
		KeyWait: s.keyWait, BaselineRef: s.baselineRef, CurveClients: joinInts(s.curveClients), LogLevel: s.logLvl,
		Repro: s.repro(), LoadBefore: b.loadBefore, OneBalance: b.gc.oneBalance, ClkTck: b.gc.clkTck,
		GCLoadBefore: b.gc.loadBefore, GCLoadAfter: b.gc.loadAfter, CurveNote: b.gc.curveNote}
	r.Heap, r.HeapBound = b.heapView(), heapBoundMiB
	if b.jan.seeded {
		r.JanitorSeedS = fmt.Sprint(b.jan.seedSeconds)
	}
	r.PG, _ = benchrun.Value(ctx, s.admin, "SHOW server_version")
	old, _ := os.ReadFile(s.report)
	// Sections measured by a run of their own (make bench-sync) or by hand
	// (each names its command): carried over as they are.
	r.Kept = markedSection(string(old), "kept")
	r.Sync = markedSection(string(old), "bench-sync")
	r.Proc = b.proc
	r.Processor = markedSection(string(old), "bench-processor")
	r.Isolation = markedSection(string(old), "bench-isolation")
	if b.proc.Measured {
		r.Processor = strings.TrimRight(withProcNotes(b.proc.Outcome.Section, string(old)), "\n")
	}
	for _, name := range b.lg.Failed {
		r.Mismatches = append(r.Mismatches, fmt.Sprintf("%s: %.2000s", name, b.lg.Results.Get(name).Raw("mismatches")))
	}
	r.Elapsed, r.LoadNow = int(time.Since(b.began).Seconds()), benchrun.LoadAverage(3)
	return r
}

func (b *bench) heapView() heapView {
	h := b.hp
	v := heapView{Sent: h.sent, Runs: len(h.runs), Distinct: "?", LoadSeconds: "?", Errors: h.errors, RelayCPS: b.heapRelayCPS()}
	leakKeys := 200000 // what a per-key leak would cost over a default run, when this one measured nothing
	if h.measured {
		leakKeys = h.distinct
		v.Distinct, v.LoadSeconds = fmt.Sprint(h.distinct), fmt.Sprintf("%.0f", h.loadSeconds)
		v.Backlog, v.Oldest = fmt.Sprintf("%.0f", h.last.First.OutboxBacklog), fmt.Sprintf("%.1f", h.last.First.OldestUnpublished)
		v.IdleAfter = fmt.Sprint(h.last.IdleAfter)
	}
	v.LeakMiB = fmt.Sprintf("%.0f", float64(leakKeys)*100/1048576)
	return v
}

// printTargets prints the targets table to stderr, as the run's summary.
func printTargets(report string) {
	in := false
	for line := range strings.Lines(report) {
		switch {
		case strings.HasPrefix(line, "| target"):
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
			fmt.Fprintln(os.Stderr)
		}
		if in {
			fmt.Fprint(os.Stderr, line)
		}
	}
}

// markedSection is the lines from <!-- NAME:begin --> to <!-- NAME:end -->
// of a report (every such block), "" when there is none.
func markedSection(report, name string) string {
	var out []string
	in := false
	for line := range strings.Lines(report) {
		line = strings.TrimRight(line, "\n")
		if line == "<!-- "+name+":begin -->" {
			in = true
		}
		if in {
			out = append(out, line)
		}
		if line == "<!-- "+name+":end -->" {
			in = false
		}
	}
	return strings.Join(out, "\n")
}

// contentsMarker is the template's line where withContents lists the
// report's sections.
const contentsMarker = "<!-- contents -->"

// withContents replaces the contents marker of report with a list of the
// sections (## headings) after it, the carried-over ones included, each
// linked as the code host anchors it.
func withContents(report string) string {
	before, after, ok := strings.Cut(report, contentsMarker+"\n")
	if !ok {
		return report
	}
	var list strings.Builder
	fenced := false
	for line := range strings.Lines(after) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if title, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "## "); ok && !fenced {
			fmt.Fprintf(&list, "- [%s](#%s)\n", title, anchor(title))
		}
	}
	return before + list.String() + after
}

// anchor is the fragment the code host gives a heading: lower case,
// letters, digits, hyphens and underscores kept, spaces made hyphens, the
// rest dropped.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// runs is the names of this run's results that match pattern (whole
// names, a regular expression), in the order they ran.
func (r report) runs(pattern string) []string {
	var names []string
	for _, run := range r.bench.lg.Results.Match(pattern) {
		names = append(names, run.Name)
	}
	return names
}

// loadHead is tableHead with a last column for the load average.
func loadHead() string {
	head, rule, _ := strings.Cut(tableHead, "\n")
	return head + " load |\n" + rule + "---:|"
}

// row is one line of a table of runs; with a load, a last column for it.
func (r report) row(name string, withLoad bool) string {
	run := r.bench.lg.Results.Get(name)
	verified := "**MISMATCH**"
	if run.Verified() {
		verified = "verified"
	}
	line := fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", name,
		run.Text("requests"), run.Text("req_per_s"), run.Text("charges_per_s"), run.Text("replays_per_s"),
		run.Text("p50_ms"), run.Text("p95_ms"), run.Text("p99_ms"), run.Text("max_ms"), run.Text("in_use"),
		run.Errors(), verified)
	if withLoad {
		line += " " + orQ(run.Load) + " |"
	}
	return line
}

// warnings are the service logs' WARN and ERROR lines.
func (b *bench) warnings() string {
	logs, _ := filepath.Glob("bin/bench-server*.log")
	return benchrun.LogWarnings(logs...)
}
