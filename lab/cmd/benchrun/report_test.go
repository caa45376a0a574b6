package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// fakeBench is a run whose steps all measured something, without running
// anything: the report's template and arithmetic alone.
func fakeBench(t *testing.T) *bench {
	t.Helper()
	dir := t.TempDir()
	results, err := benchrun.NewResults(filepath.Join(dir, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := readBenchSettings()
	if err != nil {
		t.Fatal(err)
	}
	s.report, s.admin = filepath.Join(dir, "benchmarks.md"), "postgres://nobody@127.0.0.1:1/none"
	b := &bench{log: log.New(os.Stderr, "test: ", 0), s: s, lg: &benchrun.Loadgen{Results: results},
		ref: &benchrun.Reference{}, baseline: baseline{bin: "bin/payments-baseline", commit: "ac4142a0123456789", subject: "before"}}
	add := func(name, json string) {
		r, err := benchrun.ParseRun([]byte(json))
		if err != nil {
			t.Fatal(err)
		}
		r.Name, r.Load = name, "1.00"
		if err := results.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	run := func(cps, p50, p99 float64) string {
		return fmt.Sprintf(`{"scenario":"fresh","requests":1000,"req_per_s":%[1]g,"charges":1000,"charges_per_s":%[1]g,"replays_per_s":0,`+
			`"p50_ms":%g,"p95_ms":%g,"p99_ms":%g,"max_ms":9,"in_use":0,"errors":{},"error_count":0,"verified":true,`+
			`"service_cpu_ticks":30,"seconds":10,"start_unix_ms":1000,"end_unix_ms":11000}`, cps, p50, p99, p99)
	}
	add("fresh", run(1500, 4, 12))
	add("replay", strings.Replace(run(6000, 1, 3), `"replays_per_s":0`, `"replays_per_s":6000`, 1))
	add("storm", run(100, 5, 20))
	add("mixed", run(1200, 4, 14))
	for _, side := range []string{"before", "after"} {
		add("groupcommit-"+side+"-fresh-r1", run(1000, 5, 15))
		add("groupcommit-"+side+"-one-r1", run(800, 6, 20))
		add("groupcommit-"+side+"-held-r1", strings.Replace(run(700, 7, 40), `"verified":true`, `"verified":true,"held_key_statuses":{"409":9}`, 1))
		add("groupcommit-"+side+"-single-r1", run(300, 3, 5))
	}
	add("curve-c1", run(300, 3, 5))
	add("janitor-off", run(1400, 4, 10))
	add("janitor-on", run(1300, 4, 15))
	add("heap-1", run(1500, 4, 12))
	b.scen.ref = benchrun.RefRun{Tag: "reference", TPS: "2000.0", Avg: "8.0"}
	b.ref.Runs = []benchrun.RefRun{{Tag: "groupcommit-ref-r1", Clients: 16, TPS: "2000.0", TPSValue: 2000, Avg: "8", P50: "7.000", P99: "20.000"}}
	b.gc = groupCommitFigures{clkTck: 100, oneBalance: 99999999}
	b.s.curveClients = []int{1}
	b.hp = heapFigures{runs: []string{"heap-1"}, sent: 10000, distinct: 12000, measured: true, errors: "0"}
	b.hp.last.HeapInuse, b.hp.last.First.OutboxBacklog = 20<<20, 42
	b.gob = goBenchFigures{RelayOK: true, RelayP50: "3", RelayP99: "9", RelayMax: "12", RelayEvents: "2000"}
	b.jan = janitorFigures{seeded: true, measured: true, deletedDuring: 5000, windowMs: 10000, activeMs: 5000, expiredAfter: "0"}
	return b
}

func TestReportFromAFullRun(t *testing.T) {
	b := fakeBench(t)
	if err := os.WriteFile(b.s.report, []byte("old\n<!-- bench-sync:begin -->\nSYNC SECTION\n<!-- bench-sync:end -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.writeReport(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(b.s.report)
	for _, want := range []string{
		"| fresh | 1000 | 1500 | 1500 | 0 | 4 | 12 | 12 | 9 | 0 | 0 | verified |",
		"- **fresh charges/s ÷ reference_tps = 0.75** (1500 / 2000.0)",
		"| fresh charges/s ≥ 0.6 × reference_tps | **met** | 0.75 ×",
		"| replays/s ≥ 2 × fresh charges/s | **met** | 4.00 ×",
		"| janitor deleting 1000000 expired keys: fresh p99 ≤ 2 × p99 without it | **met** | 1.50 ×",
		"heap in use 20.0 MiB (bound 48 MiB)",
		"| fresh charges/s, 16 clients over 1,000 accounts (× pg-reference) | 1000.0 (0.50 ×) | 1000.0 (0.50 ×) | 2000.0 |",
		"| service CPU per fresh charge (16 clients, 1,000 accounts): after ≤ 0.5 × before | 0.300 ms | 0.300 ms (1.00 ×) | — | **not met** |",
		"40.000 ms held vs 20.000 ms not (2.00 ×); the retrying client: 409: 9",
		"| groupcommit-ref-r1 | 16 | 2000.0 | 8 | 7.000 | 20.000 |",
		"| heap-1 | 1000 | 1500 | 1500 | 0 | 4 | 12 | 12 | 9 | 0 | 0 | verified | 1.00 |",
		"the outbox held\n42 unpublished events",
		"<!-- bench-sync:begin -->\nSYNC SECTION\n<!-- bench-sync:end -->\n",
		"- [What does group commit buy?](#what-does-group-commit-buy)\n",
		"- [How fast is a fresh charge against the database's own ceiling?](#how-fast-is-a-fresh-charge-against-the-databases-own-ceiling)\n",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	checkLayout(t, string(got))
}

// checkLayout fails on an empty template value, a double blank line, or a
// contents list that does not name every section.
func checkLayout(t *testing.T, report string) {
	t.Helper()
	if strings.Contains(report, "<no value>") || strings.Contains(report, "\n\n\n") || strings.HasSuffix(report, "\n\n") {
		t.Errorf("the report has an empty value or a double blank line:\n%s", report)
	}
	if strings.Contains(report, contentsMarker) {
		t.Error("the contents marker is still in the report")
	}
	for line := range strings.Lines(report) {
		if title, ok := strings.CutPrefix(strings.TrimSpace(line), "## "); ok &&
			!strings.Contains(report, "- ["+title+"](#"+anchor(title)+")\n") {
			t.Errorf("the contents list lacks the section %q", title)
		}
	}
}

// Whatever a run measured or skipped, the report keeps its layout.
func TestReportVariants(t *testing.T) {
	kept := "<!-- kept:begin -->\n## Measured by hand: does it hold?\n\nYes.\n<!-- kept:end -->\n"
	sync := "<!-- bench-sync:begin -->\n## Synchronous replication\n\nSlower.\n<!-- bench-sync:end -->\n"
	proc := procBegin + "\n## Processor charges: old\n\nFast.\n" + procEnd + "\n"
	for name, c := range map[string]struct {
		old  string
		edit func(*bench)
		want []string
	}{
		"curve skipped": {edit: func(b *bench) { b.s.curve, b.gc.curveNote = false, "skipped in this run (BENCH_CURVE=0)" },
			want: []string{"### At each number of clients\n\nNot measured: skipped in this run (BENCH_CURVE=0).\n\n## What does a replay cost?"}},
		"curve not drawn": {edit: func(b *bench) { b.gc.curveNote = "bin/benchplot failed: x" },
			want: []string{"Measured but not drawn: bin/benchplot failed: x. The figures:\n\nFresh charges over"}},
		"large table and CPU by part": {edit: withLargeAndCPU,
			want: []string{"| large-full-2 |", "\n\nOver 1,000 accounts:\n\npg-reference median: 1 tps", "make bench-pair    # PAIR_ACCOUNTS=1: one account\n```\n\n**Latest figures.**\n\nOver 1,000"}},
		"carried-over sections": {old: "old\n" + kept + "\n" + sync,
			want: []string{"- [Measured by hand: does it hold?](#measured-by-hand-does-it-hold)\n", "(-1: not within 90 s).\n\n" + kept + "\n" + sync}},
		"processor charges measured": {old: "old\n" + proc + "\n" + sync,
			edit: func(b *bench) {
				b.proc = procStep{Measured: true, Outcome: procOutcome{Clients: 256, SlowDelay: "50ms",
					Section:    procBegin + "\n## Processor charges: new\n" + procEnd + "\n",
					SlowResult: "**met**", SlowFigure: "0.90 ×", CPUResult: "**not met**", CPUFigure: "2.10 ×"}}
			},
			want: []string{"at 256 clients: charges/s answering after 50ms ≥ 0.8 × answering at once | **met** | 0.90 × |\n" +
				"| service CPU per processor charge ≤ 2 × per account charge | **not met** | 2.10 × |\n",
				"(-1: not within 90 s).\n\n" + procBegin + "\n## Processor charges: new\n" + procEnd + "\n\n" + sync}},
		"processor charges skipped": {old: "old\n" + kept + "\n" + proc + "\n" + sync,
			want: []string{"\n" + kept + "\n" + proc + "\n" + sync}},
		"processor charges failed": {edit: func(b *bench) { b.proc.Note = "bin/procsim did not build: x" },
			want: []string{"| not measured | bin/procsim did not build: x |"}},
		"balances mismatched": {edit: func(b *bench) { b.lg.Failed = []string{"fresh"} },
			want: []string{"**The balances did not match** in: fresh."}},
	} {
		t.Run(name, func(t *testing.T) {
			b := fakeBench(t)
			if c.old != "" {
				if err := os.WriteFile(b.s.report, []byte(c.old), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if c.edit != nil {
				c.edit(b)
			}
			err := b.writeReport(context.Background())
			if err != nil && len(b.lg.Failed) == 0 {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(b.s.report)
			for _, want := range c.want {
				if !strings.Contains(string(got), want) {
					t.Errorf("the report lacks %q:\n%s", want, got)
				}
			}
			checkLayout(t, string(got))
		})
	}
}

// withLargeAndCPU adds what the large-table and CPU-by-part steps measure.
func withLargeAndCPU(b *bench) {
	for _, name := range []string{"large-empty-1", "large-full-1", "large-full-2", "large-empty-2"} {
		r, _ := benchrun.ParseRun([]byte(`{"scenario":"fresh","p50_ms":5,"verified":true,"errors":{}}`))
		r.Name, r.Load = name, "1.00"
		_ = b.lg.Results.Add(r)
	}
	b.lt = largeFigures{ok: true, autovacuum: "off", rows: "5000000", size: "3 GB", seedSeconds: 100, vacuumSeconds: 5, took: 150}
	b.cpu.Baseline = "8685d9f"
	for _, title := range []string{"Over 1,000 accounts", "On one account", "Commit-to-publish under the same load"} {
		table := pairHeader("1", "1", 16, 10) + "| A | on | 1 | 1 | 1 | – | 1 | 1 | 1 | 1 | 1 |\n"
		b.cpu.section += "\n\n" + title + ":\n\n" + strings.TrimRight(strings.TrimLeft(table, "\n"), "\n")
	}
}

// docs/benchmarks.md is what the template writes: the same headings and
// tables, in the same order, up to the sections carried over.
func TestReportKeepsTheDocsShape(t *testing.T) {
	b := fakeBench(t)
	withLargeAndCPU(b)
	if err := b.writeReport(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(b.s.report)
	doc, err := os.ReadFile("../../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	generated, _, _ := strings.Cut(string(doc), "<!-- kept:begin -->")
	if want := skeleton(generated); !slices.Equal(skeleton(string(got)), want) {
		t.Errorf("headings and tables differ from docs/benchmarks.md's:\n got %q\nwant %q", skeleton(string(got)), want)
	}
}

func TestJanitorWindow(t *testing.T) {
	samples := [][]float64{
		{900, 0, 0, 0, 0, 0, 100}, {1000, 0, 0, 0, 0, 0, 200}, {1500, 0, 0, 0, 0, 0, 300},
		{2000, 0, 0, 0, 0, 0, 400}, {2500, 0, 0, 0, 0, 0, 400}, {3000, 0, 0, 0, 0, 0, 400},
	}
	before, during, active, window := janitorWindow(samples, 1000, 3000)
	if before != 200 || during != 200 || active != 1000 || window != 2000 {
		t.Errorf("janitorWindow = %d %d %d %d, want 200 200 1000 2000", before, during, active, window)
	}
}

func TestReproNamesOnlyWhatDiffers(t *testing.T) {
	t.Setenv("BENCH_LARGE", "0")
	t.Setenv("BENCH_CURVE_CLIENTS", "1 4")
	s, err := readBenchSettings()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.repro(), "BENCH_SECONDS=10 BENCH_CLIENTS=16 BENCH_LARGE=0 BENCH_CURVE_CLIENTS='1 4'"; got != want {
		t.Errorf("repro = %q, want %q", got, want)
	}
	t.Setenv("BENCH_HEAP_KEYS", "100")
	if _, err := readBenchSettings(); err == nil || !strings.Contains(err.Error(), "BENCH_HEAP_KEYS") {
		t.Errorf("BENCH_HEAP_KEYS=100 is accepted (err %v)", err)
	}
}
