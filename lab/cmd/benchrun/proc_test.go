package main

import (
	"context"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
	"github.com/exactlyonce/payments/lab/internal/labtest"
)

// phase is a measurement with the figures the report reads: charges/s,
// the service's CPU ticks (at 100 a second), the pool in use.
func phase(name string, round int, cps float64, serviceTicks float64) procPhaseResult {
	charges := cps * 10
	return procPhaseResult{Phase: name, Round: round, Load: "0.50", Requests: int64(charges), Charges: charges,
		StartUnixMs: 1_000, EndUnixMs: 11_000,
		ChargesPerS: cps, P50ms: 100, P99ms: 300, Statuses: map[string]int64{"201": int64(charges)},
		CPUTicks: map[string]float64{"machine": 2000, "service": serviceTicks, "postgres": 600, "processor": 100, "paymentsbench": 200},
		Pool:     poolFigures{Readings: 50, AcquiredMean: 6, AcquiredMax: 12, MaxConns: 20, Acquires: 2 * charges}}
}

// twoRounds: account 1000 charges/s at 0.3 ms of service CPU a charge;
// at once 800/s at 0.45 ms; slow 700/s then 720/s at 0.5 ms.
func twoRounds() []procPhaseResult {
	return []procPhaseResult{
		phase("account", 1, 1000, 300), phase("at once", 1, 800, 360), phase("slow", 1, 700, 350),
		phase("slow", 2, 720, 360), phase("at once", 2, 800, 360), phase("account", 2, 1000, 300),
	}
}

func TestProcGoals(t *testing.T) {
	f := procFigures{phases: twoRounds(), tck: 100}
	ratio, result, figure := f.slowGoal(false)
	// Round 1: 700/800 = 0.875; round 2: 720/800 = 0.9; the median 0.8875.
	if ratio != "0.89" || result != "**met**" || !strings.Contains(figure, "710.0 charges/s answering after the delay, 800.0 at once") {
		t.Errorf("slowGoal = %q %q %q", ratio, result, figure)
	}
	now, slow, result, figure := f.cpuGoal(false)
	// 0.45 ms and 0.5 ms against 0.3 ms.
	if now != "1.50" || slow != "1.67" || result != "**met**" || !strings.Contains(figure, "0.450 and 0.500 ms against 0.300 ms") {
		t.Errorf("cpuGoal = %q %q %q %q", now, slow, result, figure)
	}
	if _, result, _ := f.slowGoal(true); result != "**met** (smoke run: not a result)" {
		t.Errorf("a smoke run's verdict: %q", result)
	}
	slower := procFigures{phases: append(twoRounds()[:2], phase("slow", 1, 500, 1000)), tck: 100}
	if _, result, _ := slower.slowGoal(false); result != "**not met**" {
		t.Errorf("500 of 800 charges/s: %q, want not met", result)
	}
	if _, _, result, _ := slower.cpuGoal(false); result != "**not met**" {
		t.Errorf("2 ms against 0.3 ms: %q, want not met", result)
	}
	if _, result, _ := (procFigures{tck: 100}).slowGoal(false); result != "not measured" {
		t.Errorf("no phases: %q, want not measured", result)
	}
}

func TestProcRow(t *testing.T) {
	f := procFigures{phases: twoRounds(), tck: 100}
	// CPU ms per charge: machine 2000 ticks / 8000 charges = 2.5 ms, service
	// 0.45, postgres 0.75, nats 0, simulator 0.125, load generator 0.25, other
	// 2.5 − 1.575 = 0.925.
	want := "| at once | 800.0 | 100.0 | 300.0 | 16000 | 0 | 0 | 0 | 6.0 / 12 / 20 | 2.00 | 0.000 | 2.00 | 2.500 | 0.450 | 0.750 | 0.000 | 0.125 | 0.250 | 0.925 |"
	if got := f.row("at once"); got != want {
		t.Errorf("row:\n got %s\nwant %s", got, want)
	}
	if got := f.runRow(twoRounds()[2]); got != "| 1 | slow | 700.0 | 100.0 | 300.0 | 7000 | 0 | 0 | 0 | 6.0 / 12 | 0.500 | 0.50 |" {
		t.Errorf("runRow: %s", got)
	}
}

func TestPoolDuring(t *testing.T) {
	reading := func(ms int64, acquired, acquires, empty, wait float64) benchrun.Reading {
		return benchrun.Reading{UnixMs: ms, Values: map[string]float64{"payments_db_pool_acquired_conns": acquired,
			"payments_db_pool_max_conns": 20, "payments_db_pool_acquires_total": acquires,
			"payments_db_pool_empty_acquires_total": empty, "payments_db_pool_acquire_wait_seconds_total": wait}}
	}
	got := poolDuring([]benchrun.Reading{reading(0, 2, 100, 1, 0.5), reading(200, 20, 400, 11, 1.5), reading(400, 8, 700, 21, 2)})
	want := poolFigures{Readings: 3, AcquiredMean: 10, AcquiredMax: 20, MaxConns: 20, Acquires: 600, EmptyAcquires: 20, WaitSeconds: 1.5}
	if got != want {
		t.Errorf("poolDuring = %+v, want %+v", got, want)
	}
	if (poolDuring(nil) != poolFigures{}) {
		t.Error("no readings give figures")
	}
}

func TestProcSection(t *testing.T) {
	dir := t.TempDir()
	s := procSettings{rounds: 2, seconds: 10, clients: 256, accounts: 1000, refClients: 16, slowDelay: "50ms",
		quietLoad: 1, out: dir, admin: "postgres://nobody@127.0.0.1:1/postgres", goBin: "go"}
	r := &procRun{procSettings: s, log: log.New(io.Discard, "", 0), tck: 100, loadBefore: "0.42 0.80 1.10",
		phases: twoRounds(), refs: []string{"2000.0 0.5", "2200.0 0.6"}, waits: []float64{0.3, 1.25}}
	out, err := r.section(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	text := out.Section
	for _, want := range []string{
		procBegin + "\n## Processor charges: does the processor's latency limit throughput?\n",
		"PROC_ROUNDS=2 PROC_SECONDS=10 make bench-processor\n",
		"| charges/s answering after 50ms ≥ 0.8 × answering at once | **met** | 0.89 ×",
		"| service CPU per card charge ≤ 2 × per account charge | **met** | at once 1.50 ×",
		"pg-reference median: 2100.0 tps,\nmachine CPU 0.55 ms per transaction (16 clients, 10 s)",
		"\n| account | 1000.0 |", "\n| slow | 710.0 |",
		"| 2 | account | 1000.0 |",
		"at\nmost 1.2 s in this run", "0.42 0.80 1.10 before the run",
		procEnd + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the section lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "smoke") || strings.Contains(text, "<no value>") || strings.Contains(text, "\n\n\n") {
		t.Errorf("a quiet run's section is a smoke run, or has an empty value or a double blank line:\n%s", text)
	}
	if out.SlowResult != "**met**" || out.Clients != 256 || out.SlowDelay != "50ms" {
		t.Errorf("outcome %+v", out)
	}
	r.profile = true
	out, _ = r.section(context.Background())
	if !strings.Contains(out.Section, "**A profiled run, not a result** (PROC_PROFILE=1)") || strings.Contains(out.Section, "load average was") {
		t.Errorf("a profiled run is not marked as such:\n%s", out.Section)
	}
	r.profile, r.loadBefore = false, "3.10 2.00 1.00"
	out, _ = r.section(context.Background())
	if !strings.Contains(out.Section, "**A smoke run, not a result**: the machine's load average was\n3.10 2.00 1.00 before the run") ||
		!strings.Contains(out.Section, "**met** (smoke run: not a result)") {
		t.Errorf("a busy machine's run is not marked a smoke run:\n%s", out.Section)
	}
}

func TestReplaceMarkedSection(t *testing.T) {
	section := procBegin + "\nNEW\n" + procEnd + "\n"
	sync := syncBegin + "\nSYNC\n" + syncEnd + "\n"
	tests := map[string]struct{ report, want string }{
		"empty":       {"", section},
		"replaced":    {"a\n" + procBegin + "\nOLD\nlines\n" + procEnd + "\nb\n", "a\n" + section + "b\n"},
		"before sync": {"a\n" + sync, "a\n" + section + "\n" + sync},
		"appended":    {"a\n", "a\n\n" + section},
	}
	for name, tt := range tests {
		if got := replaceMarkedSection(tt.report, procBegin, procEnd, syncBegin, section); got != tt.want {
			t.Errorf("%s: got %q, want %q", name, got, tt.want)
		}
	}
}

func TestRefreshContents(t *testing.T) {
	report := "# B\n\nintro\n\n- [One](#one)\n\n## One\n\n```sh\n## not a heading\n```\n\n## Two: yes?\n"
	want := "# B\n\nintro\n\n- [One](#one)\n- [Two: yes?](#two-yes)\n\n## One\n\n```sh\n## not a heading\n```\n\n## Two: yes?\n"
	if got := refreshContents(report); got != want {
		t.Errorf("refreshContents:\n got %q\nwant %q", got, want)
	}
	if got := refreshContents("no list\n## One\n"); got != "no list\n## One\n" {
		t.Errorf("without a list: %q", got)
	}
}

// The section written into the file goes before bench-sync's, and the
// contents list names it.
func TestWriteProcSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	old := "# B\n\n- [Sync](#sync)\n\n" + syncBegin + "\n## Sync\n" + syncEnd + "\n"
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	section := procBegin + "\n## Processor charges\n" + procEnd + "\n"
	if err := writeProcSection(path, section); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# B\n\n- [Processor charges](#processor-charges)\n- [Sync](#sync)\n\n" + section + "\n" + syncBegin + "\n## Sync\n" + syncEnd + "\n"
	if string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Notes written by hand inside the section survive a new run's section.
func TestWithProcNotes(t *testing.T) {
	notes := "<!-- bench-processor-notes:begin -->\n### Why\n\nCPU.\n<!-- bench-processor-notes:end -->"
	old := "a\n" + procBegin + "\nold figures\n\n" + notes + "\n" + procEnd + "\n"
	section := procBegin + "\nnew figures\n" + procEnd + "\n"
	if got, want := withProcNotes(section, old), procBegin+"\nnew figures\n\n"+notes+"\n"+procEnd+"\n"; got != want {
		t.Errorf("withProcNotes:\n got %q\nwant %q", got, want)
	}
	if got := withProcNotes(section, "a\n"); got != section {
		t.Errorf("without notes: %q", got)
	}
}

func TestReadProcSettings(t *testing.T) {
	s, err := readProcSettings(5)
	if err != nil {
		t.Fatal(err)
	}
	if s.seconds != 5 || s.clients != 256 || s.rounds != 3 || s.slowDelay != "50ms" || s.quietLoad != 1 {
		t.Errorf("defaults: %+v", s)
	}
	if got := s.repro(); got != "PROC_ROUNDS=3 PROC_SECONDS=5 make bench-processor" || s.profile {
		t.Errorf("repro = %q", got)
	}
	t.Setenv("PROC_SLOW_DELAY", "200ms")
	t.Setenv("PROC_SERVICE_ENV", "PROCESSOR_WAIT=2s")
	s, err = readProcSettings(0)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.repro(); got != "PROC_ROUNDS=3 PROC_SECONDS=10 PROC_SLOW_DELAY=200ms PROC_SERVICE_ENV='PROCESSOR_WAIT=2s' make bench-processor" {
		t.Errorf("repro = %q", got)
	}
	for name, value := range map[string]string{"PROC_CLIENTS": "0", "PROC_SLOW_DELAY": "fast", "PROC_QUIET_LOAD": "-1", "PROC_SERVICE_ENV": "=x", "PROC_PROFILE": "yes"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			if _, err := readProcSettings(0); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want an error naming it", name, value, err)
			}
		})
	}
}

func TestMain(m *testing.M) { labtest.Main(m) }

// setUp starts the real simulator and service on scratch databases, the
// pool's metrics are there to read, and cleanup stops both and drops both
// databases.
func TestProcRunSetUpAndCleanUp(t *testing.T) {
	s, err := readProcSettings(0)
	if err != nil {
		t.Fatal(err)
	}
	s.out, s.admin = t.TempDir(), labtest.AdminURL()
	r, err := newProcRun(s, log.New(io.Discard, "", 0), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r.paymentsBin, r.simBin = labtest.Payments(t), labtest.Procsim(t)
	defer r.cleanup(t.Context())
	if err := r.setUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	pool, err := benchrun.Scrape(t.Context(), r.svc.MetricsURL, poolSeries...)
	if err != nil {
		t.Fatalf("the pool's metrics: %v", err)
	}
	if pool["payments_db_pool_max_conns"] <= 0 {
		t.Errorf("pool %v, want its size", pool)
	}
	if wait, err := r.awaitPublished(t.Context()); err != nil || wait > 10 {
		t.Errorf("awaitPublished on an idle service: %.1f s, %v", wait, err)
	}
	sim, dbs := r.sim, []string{r.db, r.simDB}
	r.cleanup(t.Context())
	if r.svc != nil || r.sim != nil || r.db != "" || r.simDB != "" {
		t.Errorf("after cleanup: service %v, simulator %v, databases %q %q", r.svc, r.sim, r.db, r.simDB)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, sim.URL+"/healthz", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Error("the simulator still answers after cleanup")
	}
	left, err := benchrun.Value(t.Context(), labtest.AdminURL(),
		"SELECT count(*)::text FROM pg_database WHERE datname = ANY($1)", dbs)
	if err != nil || left != "0" {
		t.Errorf("databases %q left after cleanup: %s (%v)", dbs, left, err)
	}
}

func TestProfilerAddr(t *testing.T) {
	path := filepath.Join(t.TempDir(), "service.log")
	log := `{"level":"INFO","msg":"listening","addr":"127.0.0.1:1"}` + "\n" +
		`{"level":"INFO","msg":"profiler listening","addr":"127.0.0.1:6061"}` + "\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := profilerAddr(path); got != "127.0.0.1:6061" {
		t.Errorf("profilerAddr = %q", got)
	}
	if got := profilerAddr(filepath.Join(t.TempDir(), "none")); got != "" {
		t.Errorf("profilerAddr of no log = %q", got)
	}
}
