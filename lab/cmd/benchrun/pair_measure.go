package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// run measures every round and prints the table.
func (p *pair) run(ctx context.Context) error {
	for _, side := range p.sides {
		for _, relay := range p.relays {
			if err := os.WriteFile(p.resultsPath(side.name, relay), nil, 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(p.hookPath(side.name, relay), nil, 0o644); err != nil {
				return err
			}
		}
	}
	refPath := filepath.Join(p.out, "pg-reference.txt")
	if err := os.WriteFile(refPath, nil, 0o644); err != nil {
		return err
	}
	var refs []string // "tps ms" a round
	for round := 1; round <= p.rounds; round++ {
		order := []pairSide{p.sides[0], p.sides[1]}
		if round%2 == 0 {
			order = []pairSide{p.sides[1], p.sides[0]}
		}
		for _, side := range order {
			for _, relay := range p.relays {
				if err := p.measure(ctx, side, relay, round); err != nil {
					return err
				}
			}
		}
		line, err := p.reference()
		if err != nil {
			return err
		}
		refs = append(refs, line)
		if err := appendLine(refPath, line); err != nil {
			return err
		}
		p.log.Printf("round %d: pg-reference %s (tps, machine CPU ms per transaction)", round, line)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return p.table(refs)
}

// resultsPath is the file of one side's measurements with the relay on or off.
func (p *pair) resultsPath(side, relay string) string {
	return filepath.Join(p.out, side+"-"+relay+".jsonl")
}

// measure is one measurement: a new database migrated by the side's build,
// a merchant, its service, a CHECKPOINT, then paymentsbench's fresh
// scenario; its JSON line goes to the side's file, its summary to stderr.
func (p *pair) measure(ctx context.Context, side pairSide, relay string, round int) error {
	// Lower case: psql folds an unquoted name, pgx quotes it.
	p.db = fmt.Sprintf("bench_pair_%d_%s_%s_%d", os.Getpid(), strings.ToLower(side.name), relay, round)
	if err := benchrun.CreateDB(ctx, p.admin, p.db); err != nil {
		return fmt.Errorf("create database %s: %w", p.db, err)
	}
	database := benchrun.WithDB(p.admin, p.db)
	merchant, err := benchrun.NewMerchant(ctx, side.bin(), database)
	if err != nil {
		return err
	}
	// METRICS_SAMPLE as shipped (Start samples every second for make bench);
	// the side's settings come last, so they win.
	env := append([]string{"NATS_URL=" + p.natsURL, "METRICS_SAMPLE=15s",
		"RELAY_ENABLED=" + strconv.FormatBool(relay == "on")}, side.env...)
	var hooks *hookReceiver
	if p.webhookSide(side.name) {
		if hooks, err = startHookReceiver(); err != nil {
			return err
		}
		defer hooks.close()
		env = append(env, "WEBHOOK_ALLOW_PRIVATE_NETWORKS=true")
	}
	logPath := filepath.Join(p.out, fmt.Sprintf("%s-%s-%d.log", side.name, relay, round))
	if p.svc, err = benchrun.Start(ctx, side.bin(), database, logPath, env...); err != nil {
		return err
	}
	if hooks != nil {
		if err := hooks.subscribe(ctx, p.svc.URL, merchant.APIKey); err != nil {
			return err
		}
	}
	if err := benchrun.Exec(ctx, p.admin, "CHECKPOINT"); err != nil {
		return err
	}
	args := []string{"-url", p.svc.URL, "-c", strconv.Itoa(p.clients), "-d", fmt.Sprintf("%ds", p.seconds),
		"-accounts", strconv.Itoa(p.accounts), "-scenarios", "fresh", "-json", "-cpu",
		"-service-pid", strconv.Itoa(p.svc.PID), "-run-id", fmt.Sprintf("%s%s%d", side.name, relay, round)}
	if relay == "on" && p.events {
		args = append(args, "-events-url", p.natsURL)
	}
	out, runErr := paymentsbench(ctx, merchant.APIKey, p.stderr, args...)
	var last []byte
	for line := range bytes.Lines(out) {
		if bytes.HasPrefix(line, []byte("{")) {
			last = tagLine(side.name, relay, round, bytes.TrimRight(line, "\n"))
			if err := appendLine(p.resultsPath(side.name, relay), string(last)); err != nil {
				return err
			}
		}
	}
	if runErr != nil {
		// cleanup stops the service and drops the database.
		return fmt.Errorf("%s relay %s round %d: %w", side.name, relay, round, runErr)
	}
	if hooks != nil {
		if err := p.settleHooks(ctx, hooks, database, side.name, relay, round); err != nil {
			return err
		}
	}
	p.svc.Stop()
	p.svc = nil
	if err := benchrun.DropDB(ctx, p.admin, p.db); err != nil {
		return err
	}
	p.db = ""
	results, err := parsePairResults(last)
	if err != nil {
		return fmt.Errorf("%s relay %s round %d: %w", side.name, relay, round, err)
	}
	if len(results) == 0 {
		return fmt.Errorf("%s relay %s round %d: paymentsbench gave no result", side.name, relay, round)
	}
	fmt.Fprintln(p.stderr, progressLine(results[0], p.tck))
	return nil
}

var referenceTPS = regexp.MustCompile(`(?m)^reference_tps=(.*)$`)

// reference runs pg-reference once, beside a watch of the machine's busy
// ticks while its pgbench runs, and returns "tps ms" (see
// measureReference); the window it watched goes to the file "window".
func (p *pair) reference() (string, error) {
	line, w, err := measureReference(p.shared, p.admin, p.clients, p.seconds, p.tck, p.stderr)
	if err != nil {
		return "", err
	}
	window := fmt.Sprintf("%d %d\n", w.Ticks, w.Ms)
	if err := os.WriteFile(filepath.Join(p.out, "window"), []byte(window), 0o644); err != nil {
		return "", err
	}
	return line, nil
}

// measureReference runs pg-reference (under shared) with clients for
// seconds on admin's server, beside a watch of the machine's busy ticks
// (tck a second) while its pgbench runs, and returns "tps ms": its tps as
// it prints them and the machine's CPU per transaction, pgbench's
// included, with the window it watched. Its messages go to stderr. It is
// not stopped by an interrupt: pg-reference drops its scratch database
// only when it ends by itself.
func measureReference(shared, admin string, clients, seconds, tck int, stderr io.Writer) (string, pgbenchWindow, error) {
	cmd := exec.Command(shared+"/bench/pg-reference", "-c", strconv.Itoa(clients),
		"-T", strconv.Itoa(seconds), "-d", admin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, stderr
	if err := cmd.Start(); err != nil {
		return "", pgbenchWindow{}, fmt.Errorf("pg-reference: %w", err)
	}
	done := make(chan struct{})
	windows := make(chan pgbenchWindow, 1)
	go func() { windows <- watchPgbench(cmd.Process.Pid, done) }()
	err := cmd.Wait()
	close(done)
	w := <-windows
	if err != nil {
		return "", w, fmt.Errorf("pg-reference: %w", err)
	}
	m := referenceTPS.FindStringSubmatch(out.String())
	if m == nil {
		return "", w, fmt.Errorf("pg-reference printed no reference_tps: %s", strings.TrimSpace(out.String()))
	}
	tps, _ := strconv.ParseFloat(m[1], 64)
	return m[1] + " " + benchrun.Fixed(cpuPerTransaction(w, tps, tck), 3), w, nil
}

// table prints pg-reference's medians and a row for each side and relay.
func (p *pair) table(refs []string) error {
	var tps, cpu []string
	for _, line := range refs {
		t, c, _ := strings.Cut(line, " ")
		tps, cpu = append(tps, t), append(cpu, c)
	}
	refTPS := textMedian(tps)
	ref, _ := strconv.ParseFloat(refTPS, 64)
	var b strings.Builder
	b.WriteString(pairHeader(refTPS, textMedian(cpu), p.clients, p.seconds))
	for _, side := range p.sides {
		for _, relay := range p.relays {
			data, err := os.ReadFile(p.resultsPath(side.name, relay))
			if err != nil {
				return err
			}
			runs, err := parsePairResults(data)
			if err != nil {
				return fmt.Errorf("%s: %w", p.resultsPath(side.name, relay), err)
			}
			b.WriteString(pairRow(side.name, relay, runs, ref, p.tck))
		}
	}
	if len(p.webhooks) > 0 {
		hooks, err := p.hookTable()
		if err != nil {
			return err
		}
		b.WriteString(hooks)
	}
	_, err := fmt.Fprint(p.stdout, b.String())
	return err
}

// appendLine appends line and a newline to the file at path, which run
// created.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
