package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := "# series clients charges_per_s p99_ms\n" +
		"service 4 900.5 12.1\n" +
		"service\t1\t300\t4.2\n" +
		"\n" +
		"pg-reference 1 800 1.5\n"
	got, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].name != "service" || got[1].name != "pg-reference" {
		t.Fatalf("series %+v, want service then pg-reference", got)
	}
	if p := got[0].points; len(p) != 2 || p[0].clients != 1 || p[1].clients != 4 || p[1].chargesPerSec != 900.5 || p[1].p99ms != 12.1 {
		t.Fatalf("service points %+v, want clients 1 then 4 with their values", p)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, in := range []string{
		"",
		"# only a comment\n",
		"service 4 900\n",
		"service four 900 1\n",
		"service 0 900 1\n",
		"service 4 fast 1\n",
		"service 4 900 -1\n",
	} {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("parse(%q): no error", in)
		}
	}
}

func TestRunDrawsBothCharts(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "curve.tsv")
	data := "service 1 300 4\nservice 2 550 5\nservice 4 900 9\npg-reference 1 800 1.5\npg-reference 2 1400 2\npg-reference 4 2000 3\n"
	if err := os.WriteFile(in, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	tp, p99 := filepath.Join(dir, "tp.png"), filepath.Join(dir, "p99.png")
	var stderr bytes.Buffer
	if err := run([]string{"-in", in, "-throughput", tp, "-p99", p99, "-title", "test"}, &stderr); err != nil {
		t.Fatalf("run: %v (%s)", err, stderr.String())
	}
	for _, path := range []string{tp, p99} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: not a PNG: %v", path, err)
		}
		if cfg.Width < 300 || cfg.Height < 200 {
			t.Errorf("%s: %dx%d, want a readable chart", path, cfg.Width, cfg.Height)
		}
	}
}

func TestRunNeedsInput(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(nil, &stderr); err == nil {
		t.Error("run without -in: no error")
	}
}

func TestNiceTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   string
	}{
		{0, 2875, "0 500 1000 1500 2000 2500"},
		{0, 138, "0 20 40 60 80 100 120"},
		{0, 1.7, "0.0 0.5 1.0 1.5"},
		{0, 1, "0.0 0.2 0.4 0.6 0.8 1.0"},
	} {
		var labels []string
		for _, tk := range (niceTicks{}).Ticks(c.lo, c.hi) {
			labels = append(labels, tk.Label)
		}
		if got := strings.Join(labels, " "); got != c.want {
			t.Errorf("Ticks(%g, %g) = %s, want %s", c.lo, c.hi, got, c.want)
		}
	}
}
