package benchrun

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Loadgen runs bin/paymentsbench and keeps its results.
type Loadgen struct {
	Bin     string // bin/paymentsbench when empty
	Results *Results
	// Failed names the runs whose balances did not match.
	Failed []string
}

// Run is one run of scenario against the service at url as the merchant
// with apiKey, named tag, args added to paymentsbench's flags; its stderr
// goes to bin/bench-TAG.err (removed when empty). It fails only when
// paymentsbench gave no result at all; a balance mismatch adds tag to
// Failed.
func (g *Loadgen) Run(ctx context.Context, tag, scenario, url, apiKey string, clients int, args ...string) (Run, error) {
	bin := g.Bin
	if bin == "" {
		bin = "bin/paymentsbench"
	}
	errPath := "bin/bench-" + tag + ".err"
	errFile, err := os.Create(errPath)
	if err != nil {
		return Run{}, err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"-url", url, "-c", strconv.Itoa(clients),
		"-scenarios", scenario, "-json"}, args...)...)
	cmd.Env = append(os.Environ(), "PAYMENTS_API_KEY="+apiKey)
	cmd.Stderr = errFile
	out, runErr := cmd.Output()
	_ = errFile.Close()
	if info, err := os.Stat(errPath); err == nil && info.Size() == 0 {
		_ = os.Remove(errPath)
	}
	run, found := scenarioLine(out, scenario)
	if !found {
		return Run{}, fmt.Errorf("paymentsbench gave no result for %s (%w): %s", tag, runErr, Tail(errPath, 3))
	}
	run.Name = tag
	run.Load = LoadAverage(1)
	if err := g.Results.Add(run); err != nil {
		return Run{}, err
	}
	if runErr != nil {
		g.Failed = append(g.Failed, tag)
	}
	return run, nil
}

// Fresh is Run of the fresh scenario.
func (g *Loadgen) Fresh(ctx context.Context, tag, url, apiKey string, clients int, args ...string) (Run, error) {
	return g.Run(ctx, tag, "fresh", url, apiKey, clients, args...)
}

// scenarioLine finds the JSON line of scenario in paymentsbench's output.
func scenarioLine(out []byte, scenario string) (Run, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		r, err := ParseRun(sc.Bytes())
		if err == nil && r.Name == scenario {
			return r, true
		}
	}
	return Run{}, false
}

// Summary is the one-line progress report of a run.
func Summary(r Run) string {
	return fmt.Sprintf("%s: %s requests, %s req/s, p50 %s ms, p99 %s ms, errors %s, verified %s", r.Name,
		r.Text("requests"), r.Text("req_per_s"), r.Text("p50_ms"), r.Text("p99_ms"), r.Errors(), r.Text("verified"))
}

// LoadAverage is the first n fields of /proc/loadavg ("?" when unreadable).
func LoadAverage(n int) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < n {
		return "?"
	}
	return strings.Join(f[:n], " ")
}
