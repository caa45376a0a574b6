package benchrun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMedianMeanPercentiles(t *testing.T) {
	if m, ok := Median([]float64{3, 1, 2}); !ok || m != 2 {
		t.Errorf("median of 3 1 2 = %v %v, want 2", m, ok)
	}
	if m, _ := Median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median of 4 1 2 3 = %v, want 2.5", m)
	}
	if _, ok := Median(nil); ok {
		t.Error("median of nothing is ok")
	}
	if m, _ := Mean([]float64{1, 2, 6}); m != 3 {
		t.Errorf("mean = %v, want 3", m)
	}
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100..1
	}
	if got := Percentiles(xs, 0.5, 0.99, 0); strings.Join(got, " ") != "50.000 99.000 1.000" {
		t.Errorf("percentiles = %v, want nearest rank 50 99 1", got)
	}
	if got := Percentiles(nil, 0.5); got[0] != "?" {
		t.Errorf("percentile of nothing = %q, want ?", got[0])
	}
}

func TestRatioAndVerdicts(t *testing.T) {
	for _, c := range []struct{ a, b, want string }{
		{"3", "2", "1.50"}, {"1", "0", "n/a"}, {"", "2", "n/a"}, {"1", "?", "n/a"},
	} {
		if got := Ratio(c.a, c.b, 2); got != c.want {
			t.Errorf("Ratio(%q, %q) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
	if AtLeast("0.6", 0.6) != "**met**" || AtLeast("0.59", 0.6) != "**not met**" {
		t.Error("AtLeast judges the bound wrong")
	}
	if AtMost("1.3", 1.3) != "**met**" || AtMost("1.31", 1.3) != "**not met**" {
		t.Error("AtMost judges the bound wrong")
	}
}

func TestRunFields(t *testing.T) {
	r, err := ParseRun([]byte(`{"scenario":"fresh","p50_ms":1.25,"verified":true,"errors":{"402":3,"none":1},` +
		`"events":{"p50_ms":9},"held_key_statuses":{"409":18}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "fresh" || r.Text("p50_ms") != "1.25" || !r.Verified() {
		t.Errorf("fields: name %q p50 %q verified %v", r.Name, r.Text("p50_ms"), r.Verified())
	}
	if got := r.Errors(); got != "402: 3, none: 1" {
		t.Errorf("Errors = %q", got)
	}
	if got := r.CountMap("held_key_statuses")["409"]; got != 18 {
		t.Errorf("held 409s = %d, want 18", got)
	}
	empty, _ := ParseRun([]byte(`{"scenario":"x","errors":{}}`))
	if empty.Errors() != "0" || empty.Text("missing") != "" {
		t.Errorf("empty errors %q, missing field %q", empty.Errors(), empty.Text("missing"))
	}
}

func TestResultsRenameAndMatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.jsonl")
	rs, err := NewResults(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"groupcommit-after-fresh-r1", "groupcommit-after-fresh-r2", "groupcommit-after-one-r1"} {
		r, _ := ParseRun([]byte(`{"scenario":"fresh","charges_per_s":100}`))
		r.Name = name
		if err := rs.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(rs.Match("groupcommit-after-fresh-r[0-9]+")); got != 2 {
		t.Errorf("matched %d runs, want 2", got)
	}
	b, _ := os.ReadFile(path)
	if strings.Count(string(b), `"scenario":"groupcommit-after-`) != 3 || strings.Contains(string(b), `"fresh"`) {
		t.Errorf("the file does not hold the renamed lines:\n%s", b)
	}
}

func TestWithDB(t *testing.T) {
	for admin, want := range map[string]string{
		"postgres://postgres@localhost:5432/postgres?sslmode=disable":                                "postgres://postgres@localhost:5432/x?sslmode=disable",
		"postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/payments?target_session_attrs=read-write": "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/x?target_session_attrs=read-write",
		"postgres://postgres@localhost/postgres":                                                     "postgres://postgres@localhost/x",
	} {
		if got := WithDB(admin, "x"); got != want {
			t.Errorf("WithDB(%q) = %q, want %q", admin, got, want)
		}
	}
}

func TestReadSeriesAndWarnings(t *testing.T) {
	var gc, heap float64
	seen, err := readSeries(strings.NewReader("# HELP x\ngo_gc_duration_seconds_count 12\ngo_memstats_heap_inuse_bytes 3.5e+06\n"+
		`go_gc_duration_seconds{quantile="0"} 1`+"\n"),
		map[string]*float64{"go_gc_duration_seconds_count": &gc, "go_memstats_heap_inuse_bytes": &heap})
	if err != nil || !seen["go_gc_duration_seconds_count"] || gc != 12 || heap != 3.5e6 {
		t.Errorf("readSeries: seen %v gc %v heap %v err %v", seen, gc, heap, err)
	}
	log := filepath.Join(t.TempDir(), "server.log")
	os.WriteFile(log, []byte(`{"level":"WARN","msg":"slow"}
{"level":"WARN","msg":"NATS disconnected"}
{"level":"INFO","msg":"fine"}
{"level":"WARN","msg":"slow"}
{"level":"ERROR","msg":"broken"}
`), 0o644)
	if got := LogWarnings(log); got != "ERROR broken ×1; WARN slow ×2" {
		t.Errorf("LogWarnings = %q", got)
	}
}

func TestParseCPUTicks(t *testing.T) {
	t.Parallel()
	// A command name with spaces and a parenthesis, as the kernel allows.
	stat := "4242 (pay ments) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 100 0 0"
	got, err := ParseCPUTicks(stat)
	if err != nil || got != 325 {
		t.Errorf("ParseCPUTicks = %d, %v; want 250 + 75 = 325", got, err)
	}
	for _, bad := range []string{"", "4242 payments S 1", "4242 (payments) S 1 2 3", "4242 (p) S 1 1 1 0 -1 0 0 0 0 0 x 75 0"} {
		if _, err := ParseCPUTicks(bad); err == nil {
			t.Errorf("ParseCPUTicks(%q): no error", bad)
		}
	}
}
