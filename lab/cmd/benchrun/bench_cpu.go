package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// cpuFigures: CPU per charge by part, the relay on and off, as
// make bench-pair prints its tables.
type cpuFigures struct {
	Baseline string
	section  string
	Took     int
}

// cpuPass is one bench-pair run of the step.
type cpuPass struct {
	accounts int
	relays   []string
	events   bool
	title    string
}

// cpuByPart runs bench-pair (pair.go) in this process: BENCH_CPU_BASELINE
// against this checkout, each with the relay on (as shipped) and off,
// alternating, pg-reference each round, over 1,000 accounts and on one;
// CPU per charge of the machine, the service, PostgreSQL, nats-server and
// the load generator from /proc. Both sides are built once, for every
// pass. Its tables go into the report as they are printed.
func (b *bench) cpuByPart(ctx context.Context) error {
	if !b.s.cpu {
		return nil
	}
	began := time.Now()
	b.cpu.Baseline = b.s.cpuBaseline
	base := b.cpu.Baseline
	if base == "" {
		base = "HEAD"
	}
	if exec.CommandContext(ctx, "git", "cat-file", "-e", base+"^{commit}").Run() != nil {
		b.cpu.Baseline = "HEAD"
	}
	sides := [2]pairSide{{name: "A", rev: b.cpu.Baseline}, {name: "B"}}
	passes := []cpuPass{
		{1000, []string{"on", "off"}, false, "Over 1,000 accounts"},
		{1, []string{"on", "off"}, false, "On one account"},
		{1000, []string{"on"}, true, "Commit-to-publish under the same load: the relay on, a NATS subscriber timing each charge's event from its transaction's start (its CPU adds to nats-server's and the load generator's)"},
	}
	const buildLog = "bin/bench-pair-build.log"
	built := b.buildPairLogged(ctx, sides, buildLog)
	for _, p := range passes {
		section := fmt.Sprintf("%s: bench-pair failed: %s", p.title, strings.ReplaceAll(benchrun.Tail(buildLog, 3), "\n", " "))
		if built {
			section = b.cpuPass(ctx, sides, p)
		}
		b.cpu.section += "\n\n" + section
	}
	b.cpu.Took = int(time.Since(began).Seconds())
	return nil
}

// buildPairLogged builds both sides and bin/paymentsbench, the builds'
// messages and a failure into logPath; it reports whether they built.
func (b *bench) buildPairLogged(ctx context.Context, sides [2]pairSide, logPath string) bool {
	b.say("CPU by part: building %s and this checkout into bin/pair-A and bin/pair-B", b.cpu.Baseline)
	f, err := os.Create(logPath)
	if err != nil {
		b.say("WARNING: %v", err)
		return false
	}
	defer f.Close()
	if err := buildPair(ctx, b.s.goBin, sides, f); err != nil {
		fmt.Fprintf(f, "bench-pair: %v\n", err)
		b.say("WARNING: %v (see %s)", err, logPath)
		return false
	}
	return true
}

func (b *bench) cpuPass(ctx context.Context, sides [2]pairSide, p cpuPass) string {
	events := ""
	if p.events {
		events = ", event delays"
	}
	relays := strings.Join(p.relays, " ")
	b.say("CPU by part: %s vs this checkout, relay %s, %d account(s)%s, %d round(s)",
		b.cpu.Baseline, relays, p.accounts, events, b.s.pairs)
	logPath := fmt.Sprintf("bin/bench-pair-%d", p.accounts)
	if p.events {
		logPath += "-events"
	}
	logPath += ".log"
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Sprintf("%s: bench-pair failed: %v", p.title, err)
	}
	defer logFile.Close()
	s := pairSettings{admin: b.s.admin, natsURL: benchrun.Getenv("NATS_URL", defaultNATSURL), goBin: b.s.goBin,
		sides: sides, rounds: b.s.pairs, seconds: b.s.seconds, clients: b.s.clients,
		accounts: p.accounts, relays: p.relays, events: p.events}
	var out bytes.Buffer
	err = runPairPass(ctx, s, &out, logFile)
	if err != nil {
		fmt.Fprintf(logFile, "bench-pair: %v\n", err)
		return fmt.Sprintf("%s: bench-pair failed: %s", p.title, strings.ReplaceAll(benchrun.Tail(logPath, 3), "\n", " "))
	}
	// From the first line that is not empty.
	table := strings.TrimLeft(out.String(), "\n")
	return fmt.Sprintf("%s:\n\n%s", p.title, strings.TrimRight(table, "\n"))
}

// runPairPass measures the builds of buildPair with s, its table to
// stdout and its progress to log, and cleans up after itself.
func runPairPass(ctx context.Context, s pairSettings, stdout, log io.Writer) error {
	p, err := newPair(s, stdout, log)
	if err != nil {
		return err
	}
	defer p.cleanup(ctx)
	return p.run(ctx)
}
