package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// syncRunLine is a load-generator run for the fixtures.
type syncRunLine struct{ name, json string }

// syncFixture holds the runs of a bench-sync as the rounds would leave them.
func syncFixture(t *testing.T, rounds int, clients []int, runs []syncRunLine, refs []benchrun.RefRun) syncFigures {
	t.Helper()
	rs, err := benchrun.NewResults(filepath.Join(t.TempDir(), "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range runs {
		r, err := benchrun.ParseRun([]byte(l.json))
		if err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		r.Name = l.name
		if err := rs.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	return syncFigures{results: rs, ref: &benchrun.Reference{Runs: refs}, rounds: rounds, clients: clients}
}

// run is a fresh run's JSON line with the figures the section reads.
func run(charges, p50, p99 string, verified bool) string {
	v := "false"
	if verified {
		v = "true"
	}
	return `{"scenario":"fresh","charges_per_s":` + charges + `,"p50_ms":` + p50 + `,"p99_ms":` + p99 +
		`,"errors":{},"verified":` + v + `}`
}

// threeRounds: at 4 clients, per-round ratios whose medians differ from
// the ratios of the medians; at 1 client, round 1 alone, C without a run.
func threeRounds(t *testing.T) syncFigures {
	return syncFixture(t, 3, []int{4, 1}, []syncRunLine{
		{"A-c4-r1", run("100", "10", "50", true)}, {"B-c4-r1", run("150", "5", "40", true)}, {"C-c4-r1", run("200", "1", "9", true)},
		{"C-c4-r2", run("200", "2", "9", true)}, {"B-c4-r2", run("100", "25", "40", true)}, {"A-c4-r2", run("200", "20", "60", false)},
		{"A-c4-r3", run("300", "30", "70", true)}, {"B-c4-r3", run("600", "10", "40", true)}, {"C-c4-r3", run("1000", "3", "9", true)},
		{"A-c1-r1", run("50", "4", "8", true)}, {"B-c1-r1", run("60", "3", "7", true)},
	}, []benchrun.RefRun{
		{Tag: "A-ref-c4-r1", TPS: "1000.0", P50: "2.000", P99: "9.000"},
		{Tag: "A-ref-c4-r2", TPS: "400.0", P50: "?", P99: "?"},
		{Tag: "C-ref-c4-r1", TPS: "0.0", P50: "1.000", P99: "3.000"},
	})
}

func TestSyncOrderAlternates(t *testing.T) {
	for r, want := range map[int]string{1: "A B C", 2: "C B A", 3: "A B C", 6: "C B A"} {
		if got := strings.Join(syncOrder(r), " "); got != want {
			t.Errorf("round %d: %s, want %s", r, got, want)
		}
	}
}

func TestSyncPairedAreMediansOfPerRoundFigures(t *testing.T) {
	got := threeRounds(t).paired()
	want := []syncPairedRow{
		// A÷C per round 0.5 1 0.3 (the medians' ratio would be 1.00);
		// A÷B 0.667 2 0.5; B÷C 0.75 0.5 0.6; A−B 5 −5 20; A−C 9 18 27.
		{Clients: 4, AOverC: "0.50", AOverB: "0.67", BOverC: "0.60", P50AMinusB: "5.00", P50AMinusC: "18.00"},
		// Only round 1, and no C.
		{Clients: 1, AOverC: "—", AOverB: "0.83", BOverC: "—", P50AMinusB: "1.00", P50AMinusC: "—"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("paired:\n got %+v\nwant %+v", got, want)
	}
}

func TestSyncSummaryMedians(t *testing.T) {
	rows := threeRounds(t).summary()
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 3 configurations × 2 client counts", len(rows))
	}
	a4 := rows[0]
	want := syncSummaryRow{Label: syncLabels["A"], Clients: 4, ChargesPerS: "200", P50: "20.00", P99: "60.00",
		// pg-reference: 1000 and 400 tps; its p50 only where it is not "?";
		// A over it per round 0.1 and 0.5 (round 3 has no reference run).
		RefTPS: "700", RefP50: "2.00", OverRef: "0.30"}
	if a4 != want {
		t.Errorf("A at 4 clients:\n got %+v\nwant %+v", a4, want)
	}
	// A reference of 0 tps gives no ratio rather than a division by zero.
	if c4 := rows[2]; c4.Label != syncLabels["C"] || c4.RefTPS != "0" || c4.OverRef != "—" {
		t.Errorf("C at 4 clients: %+v", c4)
	}
	if c1 := rows[5]; c1.Clients != 1 || c1.ChargesPerS != "—" || c1.P50 != "—" || c1.RefTPS != "—" {
		t.Errorf("C at 1 client, without runs: %+v", c1)
	}
}

func TestSyncRunsInTheOrderTheyRan(t *testing.T) {
	rows := threeRounds(t).runs()
	var names []string
	for _, r := range rows {
		names = append(names, r.Name)
	}
	want := "A-c4-r1 A-c1-r1 B-c4-r1 B-c1-r1 C-c4-r1 C-c1-r1 C-c4-r2 C-c1-r2 B-c4-r2 B-c1-r2 A-c4-r2 A-c1-r2 " +
		"A-c4-r3 A-c1-r3 B-c4-r3 B-c1-r3 C-c4-r3 C-c1-r3"
	if strings.Join(names, " ") != want {
		t.Errorf("runs:\n got %s\nwant %s", strings.Join(names, " "), want)
	}
	first := syncRunRow{Name: "A-c4-r1", ChargesPerS: "100", P50: "10", P99: "50", Errors: "0", Balances: "verified",
		RefTPS: "1000.0", RefP50: "2.000", RefP99: "9.000"}
	if rows[0] != first {
		t.Errorf("first run:\n got %+v\nwant %+v", rows[0], first)
	}
	for name, balances := range map[string]string{"A-c4-r2": "**MISMATCH**", "C-c1-r1": "no result", "C-c4-r2": "verified"} {
		i := slices.IndexFunc(rows, func(r syncRunRow) bool { return r.Name == name })
		if rows[i].Balances != balances {
			t.Errorf("%s: balances %q, want %q", name, rows[i].Balances, balances)
		}
	}
}

func TestReplaceSyncSection(t *testing.T) {
	section := syncBegin + "\nnew\n" + syncEnd + "\n"
	for _, c := range []struct{ name, report, want string }{
		{"replaces the previous one",
			"# B\n\nintro\n" + syncBegin + "\nold\nlines\n" + syncEnd + "\n<!-- kept:begin -->\ntail\n",
			"# B\n\nintro\n" + section + "<!-- kept:begin -->\ntail\n"},
		{"at the very end", "# B\n" + syncBegin + "\nold\n" + syncEnd, "# B\n" + section},
		{"appends after a blank line", "# B\n", "# B\n\n" + section},
		{"ends the last line first", "# B", "# B\n" + section},
		{"an empty report is the section", "", section},
		{"a marker inside a line is not one", "see " + syncBegin + "\n", "see " + syncBegin + "\n\n" + section},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := replaceSyncSection(c.report, section); got != c.want {
				t.Errorf("got\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func TestWriteSyncSectionTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"first", "second"} {
		if err := writeSyncSection(path, syncBegin+"\n"+body+"\n"+syncEnd+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	if want := "# Benchmarks\n\n" + syncBegin + "\nsecond\n" + syncEnd + "\n"; string(b) != want {
		t.Errorf("report:\n%q\nwant\n%q", b, want)
	}
	missing := filepath.Join(t.TempDir(), "new.md")
	if err := writeSyncSection(missing, "s\n"); err != nil {
		t.Fatalf("a missing report is created: %v", err)
	}
}

func TestSyncOthers(t *testing.T) {
	samples := "1700000000000 0\n1700000001000 3\nnot a sample\n1700000002000 0\n1700000003000 2\n"
	if got, want := syncOthers(samples), "50 % of 4 samples, 1.2 on average, at most 3"; got != want {
		t.Errorf("syncOthers = %q, want %q", got, want)
	}
	if got := syncOthers(""); got != "no samples" {
		t.Errorf("without samples: %q", got)
	}
}

func TestSyncOtherDiffs(t *testing.T) {
	primary := []string{"autovacuum=on", "log_line_prefix=%m", "ssl=on", "wal_keep_size=0", ""}
	single := []string{"autovacuum=off", "ssl=off", "wal_keep_size=0", "zz_only_here=1"}
	if got, want := syncOtherDiffs(primary, single, []string{"autovacuum"}), "log_line_prefix, ssl, zz_only_here"; got != want {
		t.Errorf("syncOtherDiffs = %q, want %q", got, want)
	}
	if got := syncOtherDiffs([]string{"a=1"}, []string{"a=1"}, nil); got != "" {
		t.Errorf("same settings: %q", got)
	}
}

// skeleton is a section's headings, markers and table headers.
func skeleton(section string) []string {
	lines := strings.Split(section, "\n")
	var out []string
	for i, l := range lines {
		header := strings.HasPrefix(l, "|") && i+1 < len(lines) && strings.HasPrefix(lines[i+1], "|---")
		if header || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "<!--") || strings.HasPrefix(l, "|---") {
			out = append(out, l)
		}
	}
	return out
}

func TestSyncSectionKeepsTheReportsShape(t *testing.T) {
	f := threeRounds(t)
	d := syncSectionData{Repro: "BENCH_SECONDS=3 make bench-sync", Clients: "4 1", DB: "syncbench_1", Seconds: 3, Rounds: 3,
		PrimaryName: "pg2", PrimaryPort: "5442", StandbyName: "pg1", StandbyPort: "5441",
		Summary: f.summary(), Paired: f.paired(), Runs: f.runs(),
		Settings: []syncSetting{{Name: "fsync", Primary: "on", Single: "on"}}, OtherDiffs: "none",
		HA: syncTableStats{"1", "2", "3", "4"}, Local: syncTableStats{"0", "0", "5", "6"},
		OthersSingle: "no samples", OthersCluster: "no samples", Warnings: "none"}
	section, err := renderSyncSection(d)
	if err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile("../../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	begin, end := strings.Index(string(report), syncBegin), strings.Index(string(report), syncEnd)
	if begin < 0 || end < begin {
		t.Fatal("docs/benchmarks.md has no bench-sync section")
	}
	if got, want := skeleton(section), skeleton(string(report)[begin:end+len(syncEnd)]); !slices.Equal(got, want) {
		t.Errorf("headings and tables differ from docs/benchmarks.md's section:\n got %q\nwant %q", got, want)
	}
	for _, want := range []string{"| A: HA primary, synchronous standby | 4 | 200 | 20.00 | 60.00 | 700 | 2.00 | 0.30 |\n",
		"| 4 | 0.50 | 0.67 | 0.60 | 5.00 | 18.00 |\n| 1 | — | 0.83 | — | 1.00 | — |\n\n### What", "|---|---|---|\n| fsync | on | on |\n\nEvery",
		"| A-c4-r1 | 100 | 10 | 50 | 0 | verified | 1000.0 | 2.000 | 9.000 |\n", "vacuumed tables 1 times",
		"(`benchrun sync`, lab/cmd/benchrun/sync.go,"} {
		if !strings.Contains(section, want) {
			t.Errorf("the section lacks %q", want)
		}
	}
	if strings.Contains(section, "<no value>") || strings.Contains(section, "bench-sync.sh") {
		t.Error("the section has an empty field or names the old script")
	}
	table := syncSummaryTable(section)
	if !strings.HasPrefix(table, "| configuration |") || !strings.HasSuffix(table, "|\n\n") || strings.Count(table, "\n") != 9 {
		t.Errorf("summary table for the terminal:\n%s", table)
	}
}

func TestSyncConfigFromEnv(t *testing.T) {
	t.Setenv("BENCH_SECONDS", "")
	t.Setenv("BENCH_SYNC_ROUNDS", "2")
	t.Setenv("BENCH_SYNC_CLIENTS", " 4  1 ")
	c, err := syncConfigFromEnv()
	if err != nil || c.seconds != 10 || c.rounds != 2 || c.clientList() != "4 1" {
		t.Errorf("config %+v, %v", c, err)
	}
	for name, value := range map[string]string{"BENCH_SECONDS": "0", "BENCH_SYNC_ROUNDS": "x", "BENCH_SYNC_CLIENTS": "4 -1"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			if _, err := syncConfigFromEnv(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%q: error %v", name, value, err)
			}
		})
	}
}
