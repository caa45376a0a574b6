package main

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// syncLabels name the configurations in the summary table.
var syncLabels = map[string]string{
	"A": "A: HA primary, synchronous standby",
	"B": "B: HA primary, synchronous_commit=local",
	"C": "C: single server (127.0.0.1:5432)",
}

// syncFigures computes the section's figures from a run's results: the
// load generator's runs (A-c16-r1, ...) and pg-reference's (A-ref-c16-r1).
type syncFigures struct {
	results *benchrun.Results
	ref     *benchrun.Reference
	rounds  int
	clients []int
}

// syncSummaryRow is a configuration at a client count: medians over the
// rounds.
type syncSummaryRow struct {
	Label                                          string
	Clients                                        int
	ChargesPerS, P50, P99, RefTPS, RefP50, OverRef string
}

// syncPairedRow is the comparisons within each round at a client count.
type syncPairedRow struct {
	Clients                                        int
	AOverC, AOverB, BOverC, P50AMinusB, P50AMinusC string
}

// syncRunRow is one run and the pg-reference run that followed it.
type syncRunRow struct {
	Name, ChargesPerS, P50, P99, Errors, Balances string
	RefTPS, RefP50, RefP99                        string
}

// syncMedian is the median of xs with digits decimals, an em dash when
// there are none.
func syncMedian(xs []float64, digits int) string {
	m, ok := benchrun.Median(xs)
	return benchrun.OrDash(benchrun.FixedOr(m, ok, digits))
}

// summary is the first table: each figure's median over the rounds.
func (f syncFigures) summary() []syncSummaryRow {
	var rows []syncSummaryRow
	for _, n := range f.clients {
		for _, cfg := range syncConfigs {
			runs := f.results.Match(fmt.Sprintf("%s-c%d-r[0-9]+", cfg, n))
			var tps, p50 []float64
			for _, r := range f.ref.Match(fmt.Sprintf("%s-ref-c%d-r[0-9]+", cfg, n)) {
				if v, ok := benchrun.Num(r.TPS); ok {
					tps = append(tps, v)
				}
				if v, ok := benchrun.Num(r.P50); ok {
					p50 = append(p50, v)
				}
			}
			rows = append(rows, syncSummaryRow{
				Label: syncLabels[cfg], Clients: n,
				ChargesPerS: syncMedian(benchrun.Floats(runs, "charges_per_s"), 0),
				P50:         syncMedian(benchrun.Floats(runs, "p50_ms"), 2),
				P99:         syncMedian(benchrun.Floats(runs, "p99_ms"), 2),
				RefTPS:      syncMedian(tps, 0),
				RefP50:      syncMedian(p50, 2),
				OverRef:     f.perRound(f.overRef(cfg, n)),
			})
		}
	}
	return rows
}

// paired is the second table: ratios and differences taken within each
// round, then their median.
func (f syncFigures) paired() []syncPairedRow {
	var rows []syncPairedRow
	for _, n := range f.clients {
		rows = append(rows, syncPairedRow{Clients: n,
			AOverC:     f.perRound(f.chargesRatio("A", "C", n)),
			AOverB:     f.perRound(f.chargesRatio("A", "B", n)),
			BOverC:     f.perRound(f.chargesRatio("B", "C", n)),
			P50AMinusB: f.perRound(f.p50Difference("A", "B", n)),
			P50AMinusC: f.perRound(f.p50Difference("A", "C", n)),
		})
	}
	return rows
}

// syncRoundFigure is a figure of one round, ok false when the round lacks
// a run it needs.
type syncRoundFigure func(round int) (v float64, ok bool)

// perRound is the median over the rounds of figure, each round's value
// first rounded to 3 decimals, with 2 decimals; an em dash when no round
// has it.
func (f syncFigures) perRound(figure syncRoundFigure) string {
	var xs []float64
	for r := 1; r <= f.rounds; r++ {
		if v, ok := figure(r); ok {
			rounded, _ := benchrun.Num(benchrun.Fixed(v, 3))
			xs = append(xs, rounded)
		}
	}
	return syncMedian(xs, 2)
}

// overRef is a configuration's charges/s over the tps of the pg-reference
// run that followed it.
func (f syncFigures) overRef(cfg string, n int) syncRoundFigure {
	return func(r int) (float64, bool) {
		a, okA := f.results.Get(syncRunName(cfg, n, r)).Float("charges_per_s")
		ref, okRef := benchrun.Num(f.ref.Get(syncRefTag(cfg, n, r)).TPS)
		return a / ref, okA && okRef && ref > 0
	}
}

// chargesRatio is cfg's charges/s over other's in the same round.
func (f syncFigures) chargesRatio(cfg, other string, n int) syncRoundFigure {
	return func(r int) (float64, bool) {
		a, okA := f.results.Get(syncRunName(cfg, n, r)).Float("charges_per_s")
		b, okB := f.results.Get(syncRunName(other, n, r)).Float("charges_per_s")
		return a / b, okA && okB && b > 0
	}
}

// p50Difference is cfg's p50 minus other's in the same round, in ms.
func (f syncFigures) p50Difference(cfg, other string, n int) syncRoundFigure {
	return func(r int) (float64, bool) {
		a, okA := f.results.Get(syncRunName(cfg, n, r)).Float("p50_ms")
		b, okB := f.results.Get(syncRunName(other, n, r)).Float("p50_ms")
		return a - b, okA && okB
	}
}

// runs is the last table: every run, in the order they ran.
func (f syncFigures) runs() []syncRunRow {
	var rows []syncRunRow
	for r := 1; r <= f.rounds; r++ {
		for _, cfg := range syncOrder(r) {
			for _, n := range f.clients {
				name := syncRunName(cfg, n, r)
				run, ref := f.results.Get(name), f.ref.Get(syncRefTag(cfg, n, r))
				balances := "verified"
				switch {
				case !f.results.Has(name):
					balances = "no result"
				case !run.Verified():
					balances = "**MISMATCH**"
				}
				rows = append(rows, syncRunRow{Name: name, ChargesPerS: run.Text("charges_per_s"),
					P50: run.Text("p50_ms"), P99: run.Text("p99_ms"), Errors: run.Errors(), Balances: balances,
					RefTPS: ref.TPS, RefP50: ref.P50, RefP99: ref.P99})
			}
		}
	}
	return rows
}

// syncTableStats is what autovacuum did in a scratch database over the
// run, and the rows it was left with.
type syncTableStats struct{ Vacuums, Analyzes, Dead, Live string }

const syncTableStatsQuery = `SELECT coalesce(sum(autovacuum_count), 0) || ' ' || coalesce(sum(autoanalyze_count), 0) || ' ' ||
  coalesce(sum(n_dead_tup), 0) || ' ' || coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables`

// readSyncTableStats reads database's statistics; "?" for each when it
// cannot.
func readSyncTableStats(ctx context.Context, database string) (syncTableStats, error) {
	v, err := benchrun.Value(ctx, database, syncTableStatsQuery)
	f := strings.Fields(v)
	if err != nil || len(f) != 4 {
		return syncTableStats{"?", "?", "?", "?"}, fmt.Errorf("pg_stat_user_tables: %q, %w", v, err)
	}
	return syncTableStats{f[0], f[1], f[2], f[3]}, nil
}

// syncOthers summarises a file of "unix_ms count" samples of a server's
// other active sessions: "42 % of 1012 samples, 0.7 on average, at most 9".
func syncOthers(samples string) string {
	var n, busy, most, sum int
	for line := range strings.Lines(samples) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		n, sum, most = n+1, sum+v, max(most, v)
		if v > 0 {
			busy++
		}
	}
	if n == 0 {
		return "no samples"
	}
	return fmt.Sprintf("%.0f %% of %d samples, %.1f on average, at most %d",
		100*float64(busy)/float64(n), n, float64(sum)/float64(n), most)
}

// syncSectionData is what sync.md.tmpl renders.
type syncSectionData struct {
	Repro, Clients, DB          string
	Seconds, Rounds, Elapsed    int
	PrimaryName, PrimaryPort    string
	StandbyName, StandbyPort    string
	Summary                     []syncSummaryRow
	Paired                      []syncPairedRow
	Settings                    []syncSetting
	OtherDiffs                  string
	HA, Local                   syncTableStats
	OthersSingle, OthersCluster string
	Runs                        []syncRunRow
	Date, CPU, Go, Commit       string
	LoadBefore, LoadAfter       string
	PGVersion, PGVersionLocal   string
	Warnings                    string
}

//go:embed sync.md.tmpl
var syncTemplateText string

var syncTemplate = template.Must(template.New("sync.md.tmpl").Parse(syncTemplateText))

// renderSyncSection is the section, from its begin marker to its end
// marker and a newline.
func renderSyncSection(d syncSectionData) (string, error) {
	var b strings.Builder
	if err := syncTemplate.Execute(&b, d); err != nil {
		return "", fmt.Errorf("render the section: %w", err)
	}
	return b.String(), nil
}

// section ends the measuring (the autovacuum statistics, the samplers)
// and renders the section.
func (s *syncRun) section(ctx context.Context) (string, error) {
	ha, err := readSyncTableStats(ctx, s.haPrimaryDB)
	if err != nil {
		s.log.Printf("the cluster's statistics: %v", err)
	}
	local, err := readSyncTableStats(ctx, s.localDB)
	if err != nil {
		s.log.Printf("the single server's statistics: %v", err)
	}
	s.stopWatches()
	loadAfter := benchrun.LoadAverage(3)
	s.elapsed = int(time.Since(s.began).Seconds())
	others := map[string]string{}
	for _, server := range []string{"single", "cluster"} {
		b, _ := os.ReadFile(syncOthersPath(server))
		others[server] = syncOthers(string(b))
	}
	logs, _ := filepath.Glob("bin/bench-sync-server-*.log")
	m := benchrun.Describe(s.goBin)
	f := syncFigures{results: s.results, ref: s.ref, rounds: s.rounds, clients: s.clients}
	return renderSyncSection(syncSectionData{
		Repro: fmt.Sprintf("BENCH_SECONDS=%d BENCH_SYNC_ROUNDS=%d BENCH_SYNC_CLIENTS='%s' make bench-sync",
			s.seconds, s.rounds, s.clientList()),
		Clients: s.clientList(), DB: s.db, Seconds: s.seconds, Rounds: s.rounds, Elapsed: s.elapsed,
		PrimaryName: s.cluster.primary.name, PrimaryPort: s.cluster.primary.port,
		StandbyName: s.cluster.standby.name, StandbyPort: s.cluster.standby.port,
		Summary: f.summary(), Paired: f.paired(), Runs: f.runs(),
		Settings: s.settings.shown, OtherDiffs: cmp.Or(s.settings.otherDiffs, "none"),
		HA: ha, Local: local, OthersSingle: others["single"], OthersCluster: others["cluster"],
		Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), CPU: fmt.Sprintf("%d × %s", m.CPUs, m.CPU),
		Go: m.Go, Commit: m.Commit, LoadBefore: s.loadBefore, LoadAfter: loadAfter,
		PGVersion: s.settings.version, PGVersionLocal: s.settings.versionLocal,
		Warnings: cmp.Or(benchrun.LogWarnings(logs...), "none"),
	})
}

// The lines that delimit the section in the report.
const (
	syncBegin = "<!-- bench-sync:begin -->"
	syncEnd   = "<!-- bench-sync:end -->"
)

// replaceSyncSection is report with section in place of its previous one
// (from a line syncBegin to a line syncEnd), or, without one, with section
// at the end, after a newline when report is not empty.
func replaceSyncSection(report, section string) string {
	return replaceMarkedSection(report, syncBegin, syncEnd, "", section)
}

// writeSyncSection replaces the section in the file at path, or appends
// it; the file is created when it does not exist.
func writeSyncSection(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, []byte(replaceSyncSection(string(old), section)), 0o644) //nolint:gosec // G703: BENCH_REPORT, the file its operator names
}

// syncSummaryTable is the section's first table and the blank line after
// it, for the terminal.
func syncSummaryTable(section string) string {
	var b strings.Builder
	in := false
	for line := range strings.Lines(section) {
		if strings.HasPrefix(line, "| configuration") {
			in = true
		}
		if in {
			b.WriteString(line)
			if strings.TrimSpace(line) == "" {
				break
			}
		}
	}
	return b.String()
}
