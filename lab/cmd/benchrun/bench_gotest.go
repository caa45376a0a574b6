package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// goBenchFigures: the Go benchmarks' targets, each a verdict and a figure.
type goBenchFigures struct {
	ClaimResult, ClaimFigure string
	BodyResult, BodyFigure   string
	RelayOK                  bool
	RelayP50, RelayP99       string
	RelayMax, RelayEvents    string
	RelayFailure             string
}

// goBench runs one benchmark on the admin server's scratch databases; its
// output goes to bin/bench-go-NAME.txt (appended when keep is set).
func (b *bench) goBench(ctx context.Context, name, pkg string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "timeout", append([]string{"600", b.s.goBin, "test", "-run", "^$", "-bench", name,
		"-timeout", "9m"}, append(args, pkg)...)...)
	cmd.Env = append(os.Environ(), "PAYMENTS_TEST_DATABASE_URL="+b.s.admin)
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile("bin/bench-go-"+name+".txt", out, 0o644); werr != nil {
		return "", werr
	}
	return string(out), err
}

// goMetric is every value reported before unit on a Benchmark line whose
// name starts with prefix.
func goMetric(out, prefix, unit string) []float64 {
	var values []float64
	for f := range splitLines(out) {
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		for i := 3; i < len(f); i++ {
			if f[i] == unit {
				if v, err := strconv.ParseFloat(f[i-1], 64); err == nil {
					values = append(values, v)
				}
			}
		}
	}
	return values
}

var goPreamble = regexp.MustCompile(`^(goos|goarch|pkg|cpu|pgtest):`)

// goFailure is the first lines that say why go test failed.
func goFailure(out string) string {
	var lines []string
	for line := range strings.Lines(out) {
		if !goPreamble.MatchString(line) && len(lines) < 3 {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	s := strings.Join(lines, " ")
	return s[:min(len(s), 300)]
}

// goBenchmarks: the key claim's overhead on the group-committed path, the
// stored body size (zstd) and the relay's commit-to-publish delay.
func (b *bench) goBenchmarks(ctx context.Context) error {
	b.keyClaim(ctx)
	b.storedBody(ctx)
	b.commitToPublish(ctx)
	return nil
}

// keyClaim: BenchmarkKeyClaimOverhead runs the same batches with and
// without the key (locks, lookup, key rows), 16 goroutines over 1,000
// accounts, interleaved BENCH_CLAIM_COUNT times; the overhead is the ratio
// of the medians, minus one.
func (b *bench) keyClaim(ctx context.Context) {
	g, n := &b.gob, b.s.claimCount
	b.say("go benchmark KeyClaimOverhead (%d runs, each with then without the key)", n)
	var all strings.Builder
	for range n {
		out, err := b.goBench(ctx, "KeyClaimOverhead", "./internal/postgres/", "-benchtime", "20000x")
		if err != nil {
			g.ClaimResult, g.ClaimFigure = "not measured", "go test failed: "+goFailure(out)
			b.say("  key claim overhead: %s", g.ClaimResult)
			return
		}
		all.WriteString(out)
	}
	path := "bin/bench-go-KeyClaimOverhead.txt"
	_ = os.WriteFile(path, []byte(all.String()), 0o644)
	with, okW := benchrun.Median(goMetric(all.String(), "BenchmarkKeyClaimOverhead/with-key", "ns/op"))
	without, okO := benchrun.Median(goMetric(all.String(), "BenchmarkKeyClaimOverhead/without-key", "ns/op"))
	if !okW || !okO {
		g.ClaimResult, g.ClaimFigure = "not measured", "go test printed no with-key/without-key lines ("+path+")"
	} else {
		pct := benchrun.Fixed(100*(with/without-1), 1)
		g.ClaimResult = benchrun.AtMost(pct, 10)
		g.ClaimFigure = fmt.Sprintf("%s %% (median of %d interleaved runs: %.0f µs a charge with the key, %.0f µs without; all runs in %s)",
			pct, n, with/1000, without/1000, path)
	}
	b.say("  key claim overhead: %s", g.ClaimResult)
}

// storedBody stores one large charge response as is and zstd-compressed.
func (b *bench) storedBody(ctx context.Context) {
	g := &b.gob
	g.BodyResult, g.BodyFigure = "not measured yet", "BenchmarkStoredBodySize does not exist yet in internal/postgres"
	if !hasBenchmark("internal/postgres", "BenchmarkStoredBodySize") {
		return
	}
	b.say("go benchmark StoredBodySize")
	out, err := b.goBench(ctx, "StoredBodySize", "./internal/postgres/", "-benchtime", "1x")
	if err != nil {
		g.BodyResult, g.BodyFigure = "not measured", "go test failed: "+goFailure(out)
		return
	}
	raw, stored, plain := goMetric(out, "Benchmark", "raw-bytes"), goMetric(out, "Benchmark", "stored-bytes"), goMetric(out, "Benchmark", "stored-plain-bytes")
	if len(raw) == 0 || len(stored) == 0 {
		g.BodyResult, g.BodyFigure = "not measured", "go test printed no raw-bytes/stored-bytes (bin/bench-go-StoredBodySize.txt)"
		return
	}
	limit := raw[0]
	if len(plain) > 0 {
		limit = plain[0]
	}
	g.BodyResult = benchrun.AtMost(benchrun.Fixed(stored[0], 0), limit-1)
	g.BodyFigure = fmt.Sprintf("a %.0f-byte charge response is stored in %.0f bytes zstd-compressed (%s × smaller than raw)",
		raw[0], stored[0], benchrun.Fixed(raw[0]/stored[0], 1))
	if len(plain) > 0 {
		g.BodyFigure += fmt.Sprintf("; stored as is it takes %.0f bytes after PostgreSQL's own TOAST compression, so zstd saves %.0f %% more",
			plain[0], 100*(1-stored[0]/plain[0]))
	}
	b.say("  stored body size: %s %s", g.BodyResult, g.BodyFigure)
}

// hasBenchmark reports whether a test file of dir declares fn.
func hasBenchmark(dir, fn string) bool {
	files, _ := filepath.Glob(dir + "/*_test.go")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "func "+fn) {
			return true
		}
	}
	return false
}

// commitToPublish: the relay's delay from a charge's transaction to a NATS
// subscriber, 200 charges/s for 10 s.
func (b *bench) commitToPublish(ctx context.Context) {
	g := &b.gob
	b.say("go benchmark CommitToPublish (relay delay; 200 charges/s for 10 s)")
	out, err := b.goBench(ctx, "CommitToPublish", "./internal/relay/", "-benchtime", "1x")
	first := func(unit string) string {
		if v := goMetric(out, "Benchmark", unit); len(v) > 0 {
			return strconv.FormatFloat(v[0], 'f', -1, 64)
		}
		return ""
	}
	switch {
	case err != nil:
		g.RelayFailure = "go test failed: " + goFailure(out)
	default:
		g.RelayP50, g.RelayP99, g.RelayMax, g.RelayEvents = first("p50-ms"), first("p99-ms"), first("max-ms"), first("events")
		g.RelayOK = g.RelayP50 != "" && g.RelayP99 != ""
		if !g.RelayOK {
			g.RelayFailure = "go test printed no p50-ms/p99-ms (bin/bench-go-CommitToPublish.txt)"
		}
	}
	b.say("  relay delay: p50 %s ms, p99 %s ms, max %s ms %s", orQ(g.RelayP50), orQ(g.RelayP99), orQ(g.RelayMax), g.RelayFailure)
}

func orQ(s string) string {
	if s == "" {
		return "?"
	}
	return s
}
