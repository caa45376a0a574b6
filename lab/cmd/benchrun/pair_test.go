package main

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// pairLines are measurements as the files of a run hold them (tagLine in
// front of paymentsbench's JSON line), at 100 clock ticks a second.
var pairLines = map[string][]string{
	// Three rounds: the median is the middle one; round 2 has no
	// nats-server ticks (they count 0).
	"A-on": {
		`{"side":"A","relay":"on","round":1,"scenario":"fresh","charges":20000,"charges_per_s":2000.04,"p50_ms":7.5,` +
			`"cpu_ticks":{"machine":2000,"service":600,"postgres":800,"nats-server":100,"paymentsbench":200},"events":{"p99_ms":12.25}}`,
		`{"side":"A","relay":"on","round":2,"scenario":"fresh","charges":18000,"charges_per_s":1800,"p50_ms":8.25,` +
			`"cpu_ticks":{"machine":1980,"service":594,"postgres":720,"paymentsbench":180},"events":{"p99_ms":14.5}}`,
		`{"side":"A","relay":"on","round":3,"scenario":"fresh","charges":22000,"charges_per_s":2200.4,"p50_ms":6.125,` +
			`"cpu_ticks":{"machine":2090,"service":660,"postgres":880,"nats-server":110,"paymentsbench":220},"events":{"p99_ms":10}}`,
	},
	// Two rounds: the median is the mean of both; only one timed its events.
	"B-off": {
		`{"side":"B","relay":"off","round":1,"scenario":"fresh","charges":30000,"charges_per_s":3000.06,"p50_ms":5.1234,` +
			`"cpu_ticks":{"machine":2653},"events":{"p99_ms":3}}`,
		`{"side":"B","relay":"off","round":2,"scenario":"fresh","charges":30000,"charges_per_s":2999.9,"p50_ms":5.2,` +
			`"cpu_ticks":{"machine":2700}}`,
	},
}

func pairRuns(t *testing.T, key string) []pairResult {
	t.Helper()
	runs, err := parsePairResults([]byte(strings.Join(pairLines[key], "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// The table's rows: medians over the rounds, rounded as the table prints
// them, the ratio to pg-reference, dashes where a figure is missing.
func TestPairRow(t *testing.T) {
	for _, c := range []struct {
		name, side, relay, key string
		ref                    float64
		want                   string
	}{
		{"odd rounds, events timed", "A", "on", "A-on", 3000,
			"| A | on | 2000 | 0.67 | 7.5 | 12.25 | 1 | 0.3 | 0.4 | 0.05 | 0.1 |\n"},
		{"even rounds, one without events", "B", "off", "B-off", 3000,
			"| B | off | 3000 | 1 | 5.162 | – | 0.892 | 0 | 0 | 0 | 0 |\n"},
		{"no pg-reference", "B", "off", "B-off", 0,
			"| B | off | 3000 | – | 5.162 | – | 0.892 | 0 | 0 | 0 | 0 |\n"},
		{"no measurement", "A", "off", "none", 3000,
			"| A | off | – | – | – | – | – | – | – | – | – |\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := pairRow(c.side, c.relay, pairRuns(t, c.key), c.ref, 100); got != c.want {
				t.Errorf("pairRow =\n%q, want\n%q", got, c.want)
			}
		})
	}
}

func TestPairHeader(t *testing.T) {
	got := pairHeader("2607.5", "0.7075", 16, 10)
	want := "\npg-reference median: 2607.5 tps, machine CPU 0.7075 ms per transaction (16 clients, 10 s)\n\n" +
		"| side | relay | charges/s | × pg-reference | p50 ms | event p99 ms | CPU ms per charge: machine | service | postgres | nats-server | load generator |\n" +
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
	if got != want {
		t.Errorf("pairHeader =\n%s, want\n%s", got, want)
	}
}

// A measurement's line: paymentsbench's JSON with the side, relay and round
// in front, and its summary on stderr.
func TestTagLineAndProgress(t *testing.T) {
	line := tagLine("A", "on", 2, []byte(`{"scenario":"fresh","charges":18000,"charges_per_s":1800.5,"p50_ms":8.25,"cpu_ticks":{"machine":1593}}`))
	want := `{"side":"A","relay":"on","round":2,"scenario":"fresh","charges":18000,"charges_per_s":1800.5,"p50_ms":8.25,"cpu_ticks":{"machine":1593}}`
	if string(line) != want {
		t.Fatalf("tagLine = %s, want %s", line, want)
	}
	runs, err := parsePairResults(line)
	if err != nil || len(runs) != 1 {
		t.Fatalf("parsePairResults = %v, %v", runs, err)
	}
	// 1593 ticks at 100 a second over 18,000 charges: 0.885 ms each.
	if got := progressLine(runs[0], 100); got != "A relay on round 2: 1800.5 charges/s, p50 8.25 ms, machine 0.885 ms/charge" {
		t.Errorf("progressLine = %q", got)
	}
	runs[0].Charges = 0
	if got := progressLine(runs[0], 100); !strings.HasSuffix(got, "machine – ms/charge") {
		t.Errorf("progressLine without charges = %q, want a dash for the CPU", got)
	}
}

// pg-reference's medians keep the middle figure's text, and give the mean
// of the two in the middle as awk printed it.
func TestTextMedian(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"2211.775693"}, "2211.775693"},
		{[]string{"3003.222829", "2211.775693", "2500.100000"}, "2500.100000"},
		{[]string{"10", "9", "100"}, "10"}, // by value, not as text
		{[]string{"2211.775693", "3003.222829"}, "2607.5"},
		{[]string{"0.818", "0.597"}, "0.7075"},
		{[]string{"1000", "3000"}, "2000"},
		{[]string{"1234567.5", "1234567.75"}, "1.23457e+06"},
		{nil, ""},
	} {
		if got := textMedian(c.in); got != c.want {
			t.Errorf("textMedian(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseBusyTicks(t *testing.T) {
	stat := "cpu  100 20 30 4000 500 6 7 8 9 10\ncpu0 50 10 15 2000 250 3 3 4 4 5\nintr 1\n"
	// user + nice + system + irq + softirq + steal; not idle, iowait, guest.
	if got, err := parseBusyTicks(stat); err != nil || got != 171 {
		t.Errorf("parseBusyTicks = %d, %v, want 171", got, err)
	}
	for _, bad := range []string{"", "intr 1 2 3 4 5 6 7 8 9\n", "cpu 1 2 3\n", "cpu 1 x 3 4 5 6 7 8 9\n"} {
		if _, err := parseBusyTicks(bad); err == nil {
			t.Errorf("parseBusyTicks(%q) succeeded", bad)
		}
	}
}

// The window counts a pgbench under pg-reference, not another one.
func TestPgbenchUnder(t *testing.T) {
	p, err := parseProcStat("30 (pg) (bench) S 20 30 30 0 -1 4194304")
	if err != nil || p.comm != "pg) (bench" || p.ppid != 20 {
		t.Fatalf("parseProcStat = %+v, %v, want comm %q, parent 20", p, err, "pg) (bench")
	}
	if _, err := parseProcStat("30 (pgbench"); err == nil {
		t.Error("parseProcStat of a cut line succeeded")
	}
	procs := map[int]proc{
		10: {"pg-reference", 1}, 20: {"bash", 10}, 30: {"pgbench", 20}, 40: {"pgbench", 1},
	}
	for _, c := range []struct {
		pid  int
		want bool
	}{{30, true}, {10, true}, {40, false}, {99, false}} {
		if got := descends(procs, c.pid, 10); got != c.want {
			t.Errorf("descends(%d, 10) = %v, want %v", c.pid, got, c.want)
		}
	}
}

func TestCPUPerTransaction(t *testing.T) {
	for _, c := range []struct {
		w    pgbenchWindow
		tps  float64
		want float64
	}{
		// 5 s of CPU over 5 s at 1,000 tps: 1 ms each.
		{pgbenchWindow{Ticks: 500, Ms: 5000}, 1000, 1},
		// 12.34 s of CPU over 9.8 s at 2211.775693 tps.
		{pgbenchWindow{Ticks: 1234, Ms: 9800}, 2211.775693, 12340 / (2211.775693 * 9.8)},
		{pgbenchWindow{}, 1000, 0},
		{pgbenchWindow{Ticks: 500, Ms: 5000}, 0, 0},
	} {
		if got := cpuPerTransaction(c.w, c.tps, 100); got != c.want {
			t.Errorf("cpuPerTransaction(%+v, %v) = %v, want %v", c.w, c.tps, got, c.want)
		}
	}
	if got := cpuPerTransaction(pgbenchWindow{Ticks: 1234, Ms: 9800}, 2211.775693, 100); got < 0.5693 || got > 0.5694 {
		t.Errorf("cpuPerTransaction = %v, want 0.5693", got)
	}
}

// batch-cost's row: per batch and per charge, a dash without batches.
func TestCostRow(t *testing.T) {
	runs, err := parsePairResults([]byte(`{"scenario":"fresh","charges":12000,"charges_per_s":1200.5,` +
		`"cpu_ticks":{"postgres":600,"service":480,"machine":2400}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := costRow(4, runs[0], 3000, 100), "| 4 | 1200.5 | 4 | 2 | 0.5 | 1.6 | 0.4 | 2 |\n"; got != want {
		t.Errorf("costRow = %q, want %q", got, want)
	}
	if got, want := costRow(4, runs[0], 0, 100), "| 4 | 1200.5 | – | – | 0.5 | – | 0.4 | 2 |\n"; got != want {
		t.Errorf("costRow without batches = %q, want %q", got, want)
	}
}

func TestReadPairSettings(t *testing.T) {
	for k, v := range map[string]string{"PAIR_A": "", "PAIR_B": "abc123", "PAIR_RELAY": "off", "PAIR_EVENTS": "1",
		"PAIR_B_ENV": "CHARGE_BATCHES=2 X=", "PAIR_A_ENV": "", "PAIR_ROUNDS": "", "PAIR_SECONDS": "3",
		"PAIR_CLIENTS": "", "PAIR_ACCOUNTS": "1"} {
		t.Setenv(k, v)
	}
	s, err := readPairSettings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.sides[0].rev != "" || s.sides[0].label() != "working tree" || s.sides[1].rev != "abc123" {
		t.Errorf("sides %+v, want A the working tree (PAIR_A set empty), B abc123", s.sides)
	}
	if !slices.Equal(s.sides[1].env, []string{"CHARGE_BATCHES=2", "X="}) || len(s.sides[0].env) != 0 {
		t.Errorf("side settings %q %q", s.sides[0].env, s.sides[1].env)
	}
	if s.rounds != 3 || s.seconds != 3 || s.clients != 16 || s.accounts != 1 || !s.events ||
		!slices.Equal(s.relays, []string{"off"}) {
		t.Errorf("settings %+v", s)
	}
	for k, v := range map[string]string{"PAIR_RELAY": "on of", "PAIR_A_ENV": "oops", "PAIR_ROUNDS": "0"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if _, err := readPairSettings(context.Background()); err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%s=%q: %v, want an error naming it", k, v, err)
			}
		})
	}
}

func TestReadCostSettings(t *testing.T) {
	for k, v := range map[string]string{"COST_CLIENTS": "2 8", "COST_SECONDS": "", "COST_ACCOUNTS": "5", "COST_RELAY": "on"} {
		t.Setenv(k, v)
	}
	s, err := readCostSettings()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.clients, []int{2, 8}) || s.seconds != 10 || s.accounts != 5 || !s.relay {
		t.Errorf("settings %+v", s)
	}
	for k, v := range map[string]string{"COST_RELAY": "yes", "COST_CLIENTS": "0", "COST_SECONDS": "1s"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if _, err := readCostSettings(); err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%s=%q: %v, want an error naming it", k, v, err)
			}
		})
	}
}
