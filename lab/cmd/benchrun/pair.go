package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// runPair is make bench-pair (the measurements of one change at a
// time): fresh charges of two builds of the service, paired in one run.
//
// Each build (default: A the commit before HEAD, B the working tree) is
// built into bin/pair-{A,B}. In every round, A then B and then B then A (so
// neither side always goes first), each with the relay on (publishing to
// NATS_URL, as shipped) and off: a new database migrated by that build, a
// merchant, `payments serve`, a CHECKPOINT, then paymentsbench's fresh
// scenario with -cpu. pg-reference runs once a round after them, the
// machine's CPU per transaction read from /proc/stat while its pgbench runs.
// It prints one line per measurement on stderr and then, on stdout, the
// medians: charges/s, × pg-reference, p50, with PAIR_EVENTS=1 and the relay
// on the p99 of the charges' events from their transaction's start to a
// NATS subscriber (paymentsbench -events-url; the subscriber adds to
// nats-server's and the load generator's CPU, so measure CPU without it),
// and CPU per charge (ms) of the machine, the service, PostgreSQL,
// nats-server and the load generator. make bench's step 4c runs it too
// (bench_cpu.go).
//
// Environment:
//
//	PAIR_A, PAIR_B         the git revisions of the two sides ("" the working
//	                       tree; default PAIR_A HEAD~1, PAIR_B the working tree)
//	PAIR_A_ENV, PAIR_B_ENV VAR=value words added to one side's service
//	                       (PAIR_A=HEAD PAIR_B=HEAD PAIR_B_ENV=CHARGE_BATCHES=2
//	                       compares a setting)
//	PAIR_ROUNDS (3), PAIR_SECONDS (10), PAIR_CLIENTS (16), PAIR_ACCOUNTS (1000)
//	PAIR_RELAY             "on off" (default), "on" or "off"
//	PAIR_EVENTS            1: time the events (with the relay on); default 0
//	PAIR_WEBHOOK           the sides ("B", "A B") whose merchant gets a
//	                       webhook endpoint for charge.succeeded on a loopback
//	                       receiver of benchrun's (pair_webhook.go), with
//	                       WEBHOOK_ALLOW_PRIVATE_NETWORKS=true: after the
//	                       main table, a table of the deliveries (per second
//	                       during the load, the time to deliver the rest after
//	                       it, the delay from the transaction's start)
//	PAIR_OUT               where every JSON line and log goes (default a new
//	                       /tmp/bench-pair.*): A-on.jsonl, A-on-1.log, ...,
//	                       pg-reference.txt ("tps ms" a round), window
//	NATS_URL               the relay's NATS (default nats://127.0.0.1:4222)
//	PAYMENTS_TEST_DATABASE_URL  a PostgreSQL where this may CREATE DATABASE
//	                       (default postgres://postgres@127.0.0.1:5432/postgres)
//	GO                     the go command (default go)
func runPair(ctx context.Context, _ *log.Logger) error {
	s, err := readPairSettings(ctx)
	if err != nil {
		return err
	}
	p, err := newPair(s, os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	defer p.cleanup(ctx)
	if err := buildPair(ctx, s.goBin, s.sides, os.Stderr); err != nil {
		return err
	}
	err = p.run(ctx)
	if err != nil && ctx.Err() != nil {
		// Returned after the deferred cleanup has run.
		return fmt.Errorf("interrupted (%w); cleaned up", err)
	}
	return err
}

// defaultNATSURL is where the relay publishes without NATS_URL.
const defaultNATSURL = "nats://127.0.0.1:4222"

// pairSettings are what a run of bench-pair measures, and where.
type pairSettings struct {
	admin, natsURL, goBin, out         string
	sides                              [2]pairSide
	rounds, seconds, clients, accounts int
	relays                             []string // "on", "off"
	events                             bool
	webhooks                           []string // the sides with a webhook endpoint
}

// pairSide is one of the two builds.
type pairSide struct {
	name string   // A or B
	rev  string   // a git revision, "" for the working tree
	env  []string // VAR=value added to its service's environment
}

// bin is where the side's build goes.
func (s pairSide) bin() string { return "bin/pair-" + s.name }

// label is the revision as the first line names it.
func (s pairSide) label() string {
	if s.rev == "" {
		return "working tree"
	}
	return s.rev
}

// readPairSettings reads the environment; it fails on a malformed value.
func readPairSettings(ctx context.Context) (pairSettings, error) {
	s := pairSettings{
		admin:   benchrun.Getenv("PAYMENTS_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
		natsURL: benchrun.Getenv("NATS_URL", defaultNATSURL),
		goBin:   benchrun.Getenv("GO", "go"),
		out:     os.Getenv("PAIR_OUT"),
	}
	revA, set := os.LookupEnv("PAIR_A")
	if !set {
		out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD~1").Output()
		if err != nil {
			return s, fmt.Errorf("PAIR_A is unset and git rev-parse HEAD~1 failed: %w", err)
		}
		revA = strings.TrimSpace(string(out))
	}
	var errs []error
	number := func(p *int, name string, def int) {
		v, err := benchrun.PositiveInt(name, def, 1)
		*p, errs = v, append(errs, err)
	}
	number(&s.rounds, "PAIR_ROUNDS", 3)
	number(&s.seconds, "PAIR_SECONDS", 10)
	number(&s.clients, "PAIR_CLIENTS", 16)
	number(&s.accounts, "PAIR_ACCOUNTS", 1000)
	var err error
	s.relays, err = relayList("PAIR_RELAY", benchrun.Getenv("PAIR_RELAY", "on off"))
	errs = append(errs, err)
	s.events, err = benchrun.Flag("PAIR_EVENTS", false)
	errs = append(errs, err)
	s.webhooks = strings.Fields(os.Getenv("PAIR_WEBHOOK"))
	for _, w := range s.webhooks {
		if w != "A" && w != "B" {
			errs = append(errs, fmt.Errorf(`PAIR_WEBHOOK must name sides, "A", "B" or "A B", got %q`, w))
		}
	}
	for i, name := range []string{"A", "B"} {
		s.sides[i] = pairSide{name: name, rev: revA, env: strings.Fields(os.Getenv("PAIR_" + name + "_ENV"))}
		if name == "B" {
			s.sides[i].rev = os.Getenv("PAIR_B")
		}
		for _, w := range s.sides[i].env {
			if k, _, ok := strings.Cut(w, "="); !ok || k == "" {
				errs = append(errs, fmt.Errorf("PAIR_%s_ENV must be VAR=value words, got %q", name, w))
			}
		}
	}
	return s, errors.Join(errs...)
}

// relayList reads "on off", "on" or "off" (the relay's settings, in order).
func relayList(name, v string) ([]string, error) {
	words := strings.Fields(v)
	for _, w := range words {
		if w != "on" && w != "off" {
			words = nil
			break
		}
	}
	if len(words) == 0 {
		return nil, fmt.Errorf(`%s must be "on off", "on" or "off", got %q`, name, v)
	}
	return words, nil
}

// buildPair builds both sides of the service and bin/paymentsbench, the
// builds' messages to log.
func buildPair(ctx context.Context, goBin string, sides [2]pairSide, log io.Writer) error {
	for _, side := range sides {
		out, err := benchrun.BuildAt(ctx, goBin, side.rev, "./cmd/payments", side.bin())
		_, _ = log.Write(out)
		if err != nil {
			return fmt.Errorf("build %s (%s): %w", side.bin(), side.label(), err)
		}
	}
	out, err := benchrun.BuildLab(ctx, goBin, "paymentsbench", "bin/paymentsbench")
	_, _ = log.Write(out)
	if err != nil {
		return fmt.Errorf("build bin/paymentsbench: %w", err)
	}
	return nil
}

// pair is one run's state: what it started, so that cleanup stops it.
type pair struct {
	pairSettings
	stdout  io.Writer
	stderr  io.Writer // each measurement's line, and paymentsbench's and pg-reference's messages
	log     *log.Logger
	shared  string
	tck     int
	scratch // the measurement under way
}

// newPair checks the tools, makes the directory of the results and says
// what the run compares. Its run measures the builds of buildPair; its
// cleanup, due on every return, stops what that started.
func newPair(s pairSettings, stdout, stderr io.Writer) (*pair, error) {
	p := &pair{pairSettings: s, stdout: stdout, stderr: stderr, log: log.New(stderr, "bench-pair: ", 0), tck: clockTicks()}
	var err error
	if p.shared, err = benchrun.SharedDir(); err != nil {
		return nil, err
	}
	if err := benchrun.RequireTools(p.goBin, "psql", "pgbench"); err != nil {
		return nil, err
	}
	if p.out == "" {
		if p.out, err = os.MkdirTemp("", "bench-pair."); err != nil {
			return nil, err
		}
	}
	for _, dir := range []string{p.out, "bin"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	a, b := p.sides[0], p.sides[1]
	p.log.Printf("A = %s %s, B = %s %s; results in %s", a.label(), strings.Join(a.env, " "),
		b.label(), strings.Join(b.env, " "), p.out)
	return p, nil
}

// cleanup stops the service and drops the database of a measurement that
// did not finish; it does not use ctx's cancellation.
func (p *pair) cleanup(ctx context.Context) { p.end(ctx, p.admin, p.log) }
