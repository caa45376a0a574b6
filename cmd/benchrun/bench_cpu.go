package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"payments/internal/benchrun"
)

// cpuFigures: CPU per charge by part, the relay on and off (issue 24), as
// make bench-pair prints its tables.
type cpuFigures struct {
	Baseline string
	section  string
	Took     int
}

// cpuPass is one make bench-pair run of the step.
type cpuPass struct {
	accounts, relays, events, title string
}

// cpuByPart runs scripts/bench-pair.sh: BENCH_CPU_BASELINE against this
// checkout, each with the relay on (as shipped) and off, alternating,
// pg-reference each round, over 1,000 accounts and on one; CPU per charge
// of the machine, the service, PostgreSQL, nats-server and the load
// generator from /proc. Its tables go into the report as they are printed.
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
	passes := []cpuPass{
		{"1000", "on off", "", "Over 1,000 accounts"},
		{"1", "on off", "", "On one account"},
		{"1000", "on", "1", "Commit-to-publish under the same load: the relay on, a NATS subscriber timing each charge's event from its transaction's start (its CPU adds to nats-server's and the load generator's)"},
	}
	for _, p := range passes {
		b.cpu.section += "\n\n" + b.cpuPass(ctx, p)
	}
	b.cpu.Took = int(time.Since(began).Seconds())
	return nil
}

func (b *bench) cpuPass(ctx context.Context, p cpuPass) string {
	events := ""
	if p.events != "" {
		events = ", event delays"
	}
	b.say("CPU by part (issue 24): %s vs this checkout, relay %s, %s account(s)%s, %d round(s)",
		b.cpu.Baseline, p.relays, p.accounts, events, b.s.pairs)
	logPath := "bin/bench-pair-" + p.accounts
	if p.events != "" {
		logPath += "-events"
	}
	logPath += ".log"
	cmd := exec.CommandContext(ctx, "scripts/bench-pair.sh")
	cmd.Env = append(os.Environ(), "PAYMENTS_TEST_DATABASE_URL="+b.s.admin, "PAIR_A="+b.cpu.Baseline, "PAIR_B=",
		fmt.Sprintf("PAIR_ROUNDS=%d", b.s.pairs), fmt.Sprintf("PAIR_SECONDS=%d", b.s.seconds),
		fmt.Sprintf("PAIR_CLIENTS=%d", b.s.clients), "PAIR_ACCOUNTS="+p.accounts, "PAIR_RELAY="+p.relays, "PAIR_EVENTS="+p.events)
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Sprintf("%s: bench-pair failed: %v", p.title, err)
	}
	defer logFile.Close()
	cmd.Stderr = logFile
	out, err := cmd.Output()
	if err != nil {
		return fmt.Sprintf("%s: bench-pair failed: %s", p.title, strings.ReplaceAll(benchrun.Tail(logPath, 3), "\n", " "))
	}
	// From the first line that is not empty.
	table := strings.TrimLeft(string(out), "\n")
	return fmt.Sprintf("%s:\n\n%s", p.title, strings.TrimRight(table, "\n"))
}
