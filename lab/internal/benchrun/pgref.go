package benchrun

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// RefRun is one pg-reference run: tps as it prints it (one decimal), its
// mean latency, and the nearest-rank p50 and p99 of pgbench's
// per-transaction log ("?" when there is none).
type RefRun struct {
	Tag              string
	Clients          int
	TPS, Avg         string
	P50, P99         string
	TPSValue, P50Val float64
}

// Reference runs ../shared/bench/pg-reference, its pgbench logging every
// transaction (a pgbench shim first on PATH adds -l) for the percentiles
// pg-reference does not print.
type Reference struct {
	Shared  string
	Seconds int
	Runs    []RefRun
	shim    string
}

// NewReference writes the pgbench shim into a new directory under tmp.
func NewReference(shared string, seconds int, tmp string) (*Reference, error) {
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		return nil, err
	}
	shim := filepath.Join(tmp, "shim")
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return nil, err
	}
	script := "#!/bin/sh\n# benchrun: pgbench, logging every transaction to $BENCH_PGBENCH_LOG.*\nexec " +
		strconv.Quote(pgbench) + ` -l --log-prefix="$BENCH_PGBENCH_LOG" "$@"` + "\n"
	if err := os.WriteFile(filepath.Join(shim, "pgbench"), []byte(script), 0o755); err != nil {
		return nil, err
	}
	return &Reference{Shared: shared, Seconds: seconds, shim: shim}, nil
}

var (
	referenceTPS = regexp.MustCompile(`(?m)^reference_tps=([0-9.]+)`)
	referenceAvg = regexp.MustCompile(`latency_avg_ms=([0-9.]*)`)
)

// Run runs pg-reference -c clients against admin's server, env added to
// its environment (PGOPTIONS), and records it as tag.
func (p *Reference) Run(ctx context.Context, tag string, clients int, admin string, env ...string) (RefRun, error) {
	logDir, err := os.MkdirTemp("", "bench-pgref-")
	if err != nil {
		return RefRun{}, err
	}
	defer os.RemoveAll(logDir)
	cmd := exec.CommandContext(ctx, p.Shared+"/bench/pg-reference", "-c", strconv.Itoa(clients),
		"-T", strconv.Itoa(p.Seconds), "-d", admin)
	cmd.Env = append(os.Environ(), "PATH="+p.shim+":"+os.Getenv("PATH"), "BENCH_PGBENCH_LOG="+logDir+"/log")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return RefRun{}, fmt.Errorf("pg-reference -c %d failed: %s", clients, strings.Join(lastLines(string(out), 3), " "))
	}
	r := RefRun{Tag: tag, Clients: clients, Avg: "?"}
	if m := referenceTPS.FindStringSubmatch(string(out)); m != nil {
		r.TPSValue, _ = strconv.ParseFloat(m[1], 64)
		r.TPS = strconv.FormatFloat(r.TPSValue, 'f', 1, 64)
	}
	if m := referenceAvg.FindStringSubmatch(string(out)); m != nil && m[1] != "" {
		r.Avg = m[1]
	}
	latencies, err := transactionLatencies(logDir)
	if err != nil {
		return RefRun{}, err
	}
	q := Percentiles(latencies, 0.5, 0.99)
	r.P50, r.P99 = q[0], q[1]
	r.P50Val, _ = strconv.ParseFloat(r.P50, 64)
	p.Runs = append(p.Runs, r)
	return r, nil
}

// transactionLatencies reads pgbench's per-transaction logs (client,
// transaction, latency in µs, ...), in ms.
func transactionLatencies(dir string) ([]float64, error) {
	files, err := filepath.Glob(dir + "/log.*")
	if err != nil {
		return nil, err
	}
	var ms []float64
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for line := range strings.Lines(string(b)) {
			fields := strings.Fields(line)
			if len(fields) < 3 {
				continue
			}
			if us, err := strconv.ParseFloat(fields[2], 64); err == nil {
				ms = append(ms, us/1000)
			}
		}
	}
	return ms, nil
}

// Get is the run tagged tag; a RefRun without figures when there is none.
func (p *Reference) Get(tag string) RefRun {
	for _, r := range p.Runs {
		if r.Tag == tag {
			return r
		}
	}
	return RefRun{Tag: tag}
}

// Match is every run whose tag matches ^pattern$.
func (p *Reference) Match(pattern string) []RefRun {
	return matching(p.Runs, pattern, func(r RefRun) string { return r.Tag })
}

// WriteFile writes every run as "TAG CLIENTS tps avg p50 p99", one a line.
func (p *Reference) WriteFile(path string) error {
	var b strings.Builder
	for _, r := range p.Runs {
		fmt.Fprintf(&b, "%s %d %s %s %s %s\n", r.Tag, r.Clients, r.TPS, r.Avg, r.P50, r.P99)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[max(len(lines)-n, 0):]
}
