package main

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// procPhaseResult is one phase of one round: the fields of paymentsbench's
// JSON line the report reads, and what benchrun adds (the phase, the
// round, the load average at its end, the pool's figures).
type procPhaseResult struct {
	Phase       string             `json:"phase"`
	Round       int                `json:"round"`
	Load        string             `json:"load"`
	StartUnixMs int64              `json:"start_unix_ms"`
	EndUnixMs   int64              `json:"end_unix_ms"`
	Requests    int64              `json:"requests"`
	Charges     float64            `json:"charges"`
	ChargesPerS float64            `json:"charges_per_s"`
	P50ms       float64            `json:"p50_ms"`
	P99ms       float64            `json:"p99_ms"`
	Statuses    map[string]int64   `json:"statuses"`
	InUse       int64              `json:"in_use"`
	Processing  int64              `json:"processing"`
	Declined    int64              `json:"declined"`
	Errors      map[string]int64   `json:"errors"`
	ErrorCount  int64              `json:"error_count"`
	Verified    bool               `json:"verified"`
	CPUTicks    map[string]float64 `json:"cpu_ticks"`
	Pool        poolFigures        `json:"pool"`
}

// poolFigures are the service's connection pool during a phase, from the
// readings of its /metrics taken while the clock ran.
type poolFigures struct {
	Readings      int     `json:"readings"`
	AcquiredMean  float64 `json:"acquired_mean"` // connections in use, the mean of the readings
	AcquiredMax   float64 `json:"acquired_max"`
	MaxConns      float64 `json:"max_conns"`      // the pool's size
	Acquires      float64 `json:"acquires"`       // connections acquired between the first and the last reading
	EmptyAcquires float64 `json:"empty_acquires"` // of them, those that waited for one
	WaitSeconds   float64 `json:"wait_seconds"`   // time spent waiting for one
}

// poolDuring sums up the readings of poolSeries.
func poolDuring(readings []benchrun.Reading) poolFigures {
	if len(readings) == 0 {
		return poolFigures{}
	}
	first, last := readings[0].Values, readings[len(readings)-1].Values
	p := poolFigures{Readings: len(readings), MaxConns: last["payments_db_pool_max_conns"],
		Acquires:      last["payments_db_pool_acquires_total"] - first["payments_db_pool_acquires_total"],
		EmptyAcquires: last["payments_db_pool_empty_acquires_total"] - first["payments_db_pool_empty_acquires_total"],
		WaitSeconds:   last["payments_db_pool_acquire_wait_seconds_total"] - first["payments_db_pool_acquire_wait_seconds_total"]}
	var sum float64
	for _, r := range readings {
		v := r.Values["payments_db_pool_acquired_conns"]
		sum += v
		p.AcquiredMax = max(p.AcquiredMax, v)
	}
	p.AcquiredMean = sum / float64(len(readings))
	return p
}

// procParts are the keys of cpu_ticks in the table's order, and "other":
// the machine's busy time that none of them used.
var procParts = []string{"machine", "service", "postgres", "nats-server", "processor", "paymentsbench", "other"}

// cpuPerCharge is part's CPU time per 201 in ms (ticks at tck a second);
// ok is false when the phase made no charge or has no CPU figures.
func (r procPhaseResult) cpuPerCharge(part string, tck int) (float64, bool) {
	if r.Charges <= 0 || tck <= 0 || r.CPUTicks == nil {
		return 0, false
	}
	ticks := r.CPUTicks[part]
	if part == "other" {
		ticks = r.CPUTicks["machine"]
		for _, p := range procParts[1 : len(procParts)-1] {
			ticks -= r.CPUTicks[p]
		}
	}
	return 1000 * ticks / float64(tck) / r.Charges, true
}

// cpusBusy is how many of the machine's CPUs were busy on average over
// the phase's measured seconds; ok is false without the figures.
func (r procPhaseResult) cpusBusy(tck int) (float64, bool) {
	ms := r.EndUnixMs - r.StartUnixMs
	if ms <= 0 || tck <= 0 || r.CPUTicks == nil {
		return 0, false
	}
	return r.CPUTicks["machine"] / float64(tck) / (float64(ms) / 1000), true
}

// progress is the line a phase prints on stderr.
func (r procPhaseResult) progress(tck int) string {
	svc, _ := r.cpuPerCharge("service", tck)
	return fmt.Sprintf("%s round %d: %.1f charges/s (201 %d, 202 %d, 402 %d, errors %d), p50 %.1f ms, p99 %.1f ms; pool %.1f mean, %.0f max of %.0f; service %.3f ms CPU per charge; load %s",
		r.Phase, r.Round, r.ChargesPerS, r.Statuses["201"], r.Processing, r.Declined, r.ErrorCount, r.P50ms, r.P99ms,
		r.Pool.AcquiredMean, r.Pool.AcquiredMax, r.Pool.MaxConns, svc, r.Load)
}

// procFigures are a run's phases, by phase and round.
type procFigures struct {
	phases []procPhaseResult
	tck    int
}

// of is the phase's results, in round order.
func (f procFigures) of(phase string) []procPhaseResult {
	var out []procPhaseResult
	for _, r := range f.phases {
		if r.Phase == phase {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b procPhaseResult) int { return cmp.Compare(a.Round, b.Round) })
	return out
}

// median is the median of f over the phase's rounds where it has a figure.
func (f procFigures) median(phase string, v func(procPhaseResult) (float64, bool)) (float64, bool) {
	var xs []float64
	for _, r := range f.of(phase) {
		if x, ok := v(r); ok {
			xs = append(xs, x)
		}
	}
	return benchrun.Median(xs)
}

// pairedRatio is the median over the rounds of v(a) ÷ v(b), each round's
// phases a and b taken together.
func (f procFigures) pairedRatio(a, b string, v func(procPhaseResult) (float64, bool)) (float64, bool) {
	bs := map[int]procPhaseResult{}
	for _, r := range f.of(b) {
		bs[r.Round] = r
	}
	var xs []float64
	for _, r := range f.of(a) {
		x, okA := v(r)
		y, okB := v(bs[r.Round])
		if _, paired := bs[r.Round]; paired && okA && okB && y > 0 {
			xs = append(xs, x/y)
		}
	}
	return benchrun.Median(xs)
}

func chargesPerS(r procPhaseResult) (float64, bool) { return r.ChargesPerS, r.Requests > 0 }

// serviceCPU is the service's CPU per charge of a phase, in ms.
func (f procFigures) serviceCPU(r procPhaseResult) (float64, bool) {
	return r.cpuPerCharge("service", f.tck)
}

// row is the summary table's row of a phase: medians over its rounds, and
// the sums of its answers.
func (f procFigures) row(phase string) string {
	runs := f.of(phase)
	fixed := func(v float64, ok bool, digits int) string { return benchrun.OrDash(benchrun.FixedOr(v, ok, digits)) }
	med := func(v func(procPhaseResult) float64, digits int) string {
		x, ok := f.median(phase, func(r procPhaseResult) (float64, bool) { return v(r), true })
		return fixed(x, ok, digits)
	}
	var created, processing, declined, errs int64
	var poolMax, poolSize float64
	for _, r := range runs {
		created, processing, declined, errs = created+r.Statuses["201"], processing+r.Processing, declined+r.Declined, errs+r.ErrorCount
		poolMax, poolSize = max(poolMax, r.Pool.AcquiredMax), max(poolSize, r.Pool.MaxConns)
	}
	cells := []string{phase, med(func(r procPhaseResult) float64 { return r.ChargesPerS }, 1),
		med(func(r procPhaseResult) float64 { return r.P50ms }, 1), med(func(r procPhaseResult) float64 { return r.P99ms }, 1),
		fmt.Sprint(created), fmt.Sprint(processing), fmt.Sprint(declined), fmt.Sprint(errs),
		med(func(r procPhaseResult) float64 { return r.Pool.AcquiredMean }, 1) + fmt.Sprintf(" / %.0f / %.0f", poolMax, poolSize),
		med(func(r procPhaseResult) float64 { return perCharge(r.Pool.Acquires, r.Charges) }, 2),
		med(func(r procPhaseResult) float64 { return perCharge(1000*r.Pool.WaitSeconds, r.Charges) }, 3)}
	busy, ok := f.median(phase, func(r procPhaseResult) (float64, bool) { return r.cpusBusy(f.tck) })
	cells = append(cells, fixed(busy, ok, 2))
	for _, part := range procParts {
		ms, ok := f.median(phase, func(r procPhaseResult) (float64, bool) { return r.cpuPerCharge(part, f.tck) })
		cells = append(cells, fixed(ms, ok, 3))
	}
	return "| " + strings.Join(cells, " | ") + " |"
}

// perCharge is n per charge, 0 without charges.
func perCharge(n, charges float64) float64 {
	if charges <= 0 {
		return 0
	}
	return n / charges
}

// runRow is the table of runs' row of one phase of one round.
func (f procFigures) runRow(r procPhaseResult) string {
	svc, ok := r.cpuPerCharge("service", f.tck)
	errs := "0"
	if r.ErrorCount > 0 {
		errs = fmt.Sprint(r.Errors)
	}
	return fmt.Sprintf("| %d | %s | %.1f | %.1f | %.1f | %d | %d | %d | %s | %.1f / %.0f | %s | %s |", r.Round, r.Phase,
		r.ChargesPerS, r.P50ms, r.P99ms, r.Statuses["201"], r.Processing, r.Declined, errs,
		r.Pool.AcquiredMean, r.Pool.AcquiredMax, benchrun.OrDash(benchrun.FixedOr(svc, ok, 3)), r.Load)
}

//go:embed proc.md.tmpl
var procTemplateText string

var procTemplate = template.Must(template.New("proc.md.tmpl").
	Funcs(template.FuncMap{"orDash": benchrun.OrDash}).Parse(procTemplateText))

// The lines that delimit the section in the report.
const (
	procBegin = "<!-- bench-processor:begin -->"
	procEnd   = "<!-- bench-processor:end -->"
)

// procSectionData is what proc.md.tmpl renders.
type procSectionData struct {
	S                                  procView
	Repro, QuietLoad                   string
	Smoke, Busy, Profiled              bool
	LoadBefore, LoadAfter              string
	SlowRatio, SlowResult, SlowFigure  string
	CPUNow, CPUSlow, CPUResult, CPUFig string
	RefTPS, RefCPU                     string
	Rows, Runs                         []string
	Drained                            string
	Date, CPU, PG, Go, Commit          string
	Warnings                           string
	Elapsed, CPUs                      int
}

// procView is procSettings for the template.
type procView struct {
	Rounds, Seconds, Clients, Accounts, RefClients int
	SlowDelay                                      string
	ServiceEnv                                     []string
}

// procOutcome is what a run gives the report: its section, and its goals
// for make bench's table of targets.
type procOutcome struct {
	Clients                int
	SlowDelay              string
	Section                string
	SlowResult, SlowFigure string
	CPUResult, CPUFigure   string
}

// section renders the run's section of the report.
func (r *procRun) section(ctx context.Context) (procOutcome, error) {
	f := procFigures{phases: r.phases, tck: r.tck}
	m := benchrun.Describe(r.goBin)
	s := r.procSettings
	d := procSectionData{S: procView{Rounds: s.rounds, Seconds: s.seconds, Clients: s.clients, Accounts: s.accounts,
		RefClients: s.refClients, SlowDelay: s.slowDelay, ServiceEnv: s.serviceEnv}, Repro: r.repro(), QuietLoad: benchrun.Fixed(r.quietLoad, 1),
		LoadBefore: r.loadBefore, LoadAfter: benchrun.LoadAverage(3),
		Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), CPU: fmt.Sprintf("%d × %s", m.CPUs, m.CPU),
		Go: m.Go, Commit: m.Commit, Elapsed: int(time.Since(r.began).Seconds()), CPUs: m.CPUs,
		Warnings: cmp.Or(benchrun.LogWarnings(r.serviceLog()), "none")}
	d.PG, _ = benchrun.Value(ctx, r.admin, "SHOW server_version")
	load1, _ := benchrun.Num(strings.Fields(r.loadBefore + " ?")[0])
	d.Busy = load1 >= r.quietLoad || r.loadBefore == "?"
	d.Profiled, d.Smoke = r.profile, d.Busy || r.profile
	d.SlowRatio, d.SlowResult, d.SlowFigure = f.slowGoal(d.Smoke)
	d.CPUNow, d.CPUSlow, d.CPUResult, d.CPUFig = f.cpuGoal(d.Smoke)
	var tps, cpu []string
	for _, line := range r.refs {
		t, c, _ := strings.Cut(line, " ")
		tps, cpu = append(tps, t), append(cpu, c)
	}
	d.RefTPS, d.RefCPU = oneDecimal(textMedian(tps)), textMedian(cpu)
	for _, ph := range procPhases {
		d.Rows = append(d.Rows, f.row(ph.name))
	}
	for _, res := range r.phases {
		d.Runs = append(d.Runs, f.runRow(res))
	}
	if len(r.waits) > 0 {
		d.Drained = benchrun.Fixed(slices.Max(r.waits), 1)
	}
	var b bytes.Buffer
	if err := procTemplate.Execute(&b, d); err != nil {
		return procOutcome{}, err
	}
	return procOutcome{Clients: s.clients, SlowDelay: s.slowDelay, Section: b.String(), SlowResult: d.SlowResult, SlowFigure: d.SlowFigure,
		CPUResult: d.CPUResult, CPUFigure: d.CPUFig}, nil
}

// oneDecimal is a number's text with one decimal, "" when it is none.
func oneDecimal(text string) string {
	v, ok := benchrun.Num(text)
	return benchrun.FixedOr(v, ok, 1)
}

// slowGoal is the verdict of slow ÷ at once ≥ 0.8 in charges/s.
func (f procFigures) slowGoal(smoke bool) (ratio, result, figure string) {
	x, ok := f.pairedRatio("slow", "at once", chargesPerS)
	ratio = benchrun.FixedOr(x, ok, 2)
	result = verdictOf(ok, x >= 0.8, smoke)
	now, _ := f.median("at once", chargesPerS)
	slow, _ := f.median("slow", chargesPerS)
	figure = fmt.Sprintf("%s × (median of the rounds' ratios; medians %.1f charges/s answering after the delay, %.1f at once)",
		benchrun.OrDash(ratio), slow, now)
	return ratio, result, figure
}

// cpuGoal is the verdict of the service's CPU per card charge ÷ per
// account charge ≤ 2, for both card phases.
func (f procFigures) cpuGoal(smoke bool) (now, slow, result, figure string) {
	x, okNow := f.pairedRatio("at once", "account", f.serviceCPU)
	y, okSlow := f.pairedRatio("slow", "account", f.serviceCPU)
	now, slow = benchrun.FixedOr(x, okNow, 2), benchrun.FixedOr(y, okSlow, 2)
	result = verdictOf(okNow && okSlow, x <= 2 && y <= 2, smoke)
	ms := func(phase string) string {
		v, ok := f.median(phase, f.serviceCPU)
		return benchrun.OrDash(benchrun.FixedOr(v, ok, 3))
	}
	figure = fmt.Sprintf("at once %s ×, answering after the delay %s × (medians of the rounds' ratios; %s and %s ms against %s ms per account charge)",
		benchrun.OrDash(now), benchrun.OrDash(slow), ms("at once"), ms("slow"), ms("account"))
	return now, slow, result, figure
}

// verdictOf is a goal's result: not measured, met or not, and a smoke
// run's marked as such.
func verdictOf(measured, met, smoke bool) string {
	v := "not measured"
	if measured {
		v = "**not met**"
		if met {
			v = "**met**"
		}
	}
	if smoke {
		v += " (smoke run: not a result)"
	}
	return v
}

// writeProcSection replaces the section in the file at path, or puts it
// before bench-sync's (which make bench keeps last), or at the end; the
// notes of the section it replaces are kept (withProcNotes).
func writeProcSection(path, section string) error {
	old, _ := os.ReadFile(path) // none: no notes, and writeMarkedSection creates it
	return writeMarkedSection(path, procBegin, procEnd, syncBegin, withProcNotes(section, string(old)))
}

// withProcNotes is withNotes for bench-processor's section.
func withProcNotes(section, report string) string {
	return withNotes(section, report, "bench-processor-notes", procEnd)
}

// withNotes is section with the notes of report's section (written by hand
// between <!-- NOTES:begin --> and its end, each naming the command behind
// its figures) put back before its end line, after a blank line; section as
// it is when report has none.
func withNotes(section, report, notesName, end string) string {
	notes := markedSection(report, notesName)
	body, found := strings.CutSuffix(section, end+"\n")
	if notes == "" || !found {
		return section
	}
	return body + "\n" + notes + "\n" + end + "\n"
}
