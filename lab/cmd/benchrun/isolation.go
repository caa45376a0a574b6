package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// runIsolation is make bench-isolation: does one merchant slow another? It
// writes the section "Isolation between merchants" of docs/benchmarks.md,
// between <!-- bench-isolation:begin --> and <!-- bench-isolation:end -->.
//
// It builds bin/payments from the working tree and starts, on a scratch
// database per mode and a NATS of the run's own, one `payments serve` with
// the relay on, in two modes: as shipped (the per-merchant budgets at their
// defaults, RATE_LIMIT_READS=100 and RATE_LIMIT_WRITES=1000) and without
// budgets (both 0), the service before them. Merchant A and merchant B
// each have an account. In each mode, ISO_ROUNDS rounds of two phases,
// each after a CHECKPOINT and ISO_SECONDS long:
//
//	alone     B's ISO_CHARGERS clients charge, ISO_RATE charges a second in
//	          all, each client on its schedule (within B's budget)
//	readers   the same, while ISO_READERS clients of A read its charges
//	          (GET /v1/charges?limit=10) at full speed, never waiting,
//	          whatever the answer (Retry-After ignored)
//
// Then, as shipped, the holds: ISO_HOLDS one-cent authorizations on A's
// account, written by SQL, all expiring at one moment while B's clients
// charge, with the expiry sweep every second (CHARGE_EXPIRY_INTERVAL=1s).
// Each of B's charge.succeeded events is timed from its created_at (its
// transaction's start) to its arrival at a NATS subscriber, until the
// sweep has expired every hold.
//
// The goals (issue 46): with A's readers, B's charge p50 within 2x of
// alone and none of B's requests refused; through the holds' expiry, none
// of B's events later than 1 s.
//
// Environment:
//
//	ISO_SECONDS (10), ISO_ROUNDS (2), ISO_READERS (96), ISO_CHARGERS (4),
//	ISO_RATE (200), ISO_HOLDS (200000)
//	ISO_OUT          where the service's logs go (default a new
//	                 /tmp/bench-isolation.*)
//	BENCH_REPORT     the file whose section is rewritten (default
//	                 docs/benchmarks.md; "-" writes none)
//	PAYMENTS_BENCH_DATABASE_URL, else PAYMENTS_TEST_DATABASE_URL: a
//	                 PostgreSQL where this may CREATE DATABASE
//	GO               the go command (default go)
func runIsolation(ctx context.Context, logger *log.Logger) error {
	s, err := readIsoSettings()
	if err != nil {
		return err
	}
	s.loadBefore = benchrun.LoadAverage(3)
	out, err := benchrun.BuildCurrent(ctx, s.goBin)
	_, _ = os.Stderr.Write(out)
	if err != nil {
		return err
	}
	nats, err := benchrun.StartNATS(ctx)
	if err != nil {
		return fmt.Errorf("a NATS of the run's own: %w", err)
	}
	defer nats.Stop()
	var res isoResults
	for _, m := range isoModes {
		r, err := s.measureMode(ctx, logger, m, nats.URL)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted (%w); cleaned up", err)
			}
			return err
		}
		res.modes = append(res.modes, r)
	}
	section := res.section(s)
	if s.report != "-" {
		if err := writeIsoSection(s.report, section); err != nil {
			return fmt.Errorf("write %s: %w", s.report, err)
		}
		logger.Printf("wrote the section of %s", s.report)
	}
	fmt.Print(section)
	return nil
}

// isoMode is one configuration of the service.
type isoMode struct {
	name, tag string
	env       []string
	holds     bool // measure the holds' expiry in this mode
}

var isoModes = []isoMode{
	{name: "as shipped", tag: "shipped", env: []string{"RATE_LIMIT_READS=100", "RATE_LIMIT_WRITES=1000"}, holds: true},
	{name: "no budgets", tag: "none", env: []string{"RATE_LIMIT_READS=0", "RATE_LIMIT_WRITES=0"}},
}

// isoSettings are what a run measures, and where.
type isoSettings struct {
	seconds, rounds, readers, chargers, holds int
	rate                                      float64 // B's charges a second
	out, report, admin, goBin, loadBefore     string
}

func readIsoSettings() (isoSettings, error) {
	s := isoSettings{
		out:    os.Getenv("ISO_OUT"),
		report: benchrun.Getenv("BENCH_REPORT", "docs/benchmarks.md"),
		goBin:  benchrun.Getenv("GO", "go"),
		admin: benchrun.Getenv("PAYMENTS_BENCH_DATABASE_URL", benchrun.Getenv("PAYMENTS_TEST_DATABASE_URL",
			"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")),
	}
	var errs []error
	number := func(p *int, name string, def int) {
		v, err := benchrun.PositiveInt(name, def, 1)
		*p, errs = v, append(errs, err)
	}
	number(&s.seconds, "ISO_SECONDS", 10)
	number(&s.rounds, "ISO_ROUNDS", 2)
	number(&s.readers, "ISO_READERS", 96)
	number(&s.chargers, "ISO_CHARGERS", 4)
	number(&s.holds, "ISO_HOLDS", 200_000)
	var rate int
	number(&rate, "ISO_RATE", 200)
	s.rate = float64(rate)
	if s.out == "" {
		dir, err := os.MkdirTemp("", "bench-isolation.")
		s.out, errs = dir, append(errs, err)
	}
	return s, errors.Join(errs...)
}

// modeResult is what one mode measured: each phase of each round, and
// the holds' expiry when measured.
type modeResult struct {
	mode   isoMode
	phases []phaseResult
	holds  *holdsResult
}

// measureMode starts the mode's service on a scratch database, measures
// it, and stops it and drops the database on every return.
func (s isoSettings) measureMode(ctx context.Context, logger *log.Logger, m isoMode, natsURL string) (modeResult, error) {
	db := fmt.Sprintf("bench_iso_%s_%d", m.tag, os.Getpid())
	if err := benchrun.CreateDB(ctx, s.admin, db); err != nil {
		return modeResult{}, fmt.Errorf("create database %s: %w", db, err)
	}
	sc := &scratch{db: db}
	defer sc.end(ctx, s.admin, logger)
	database := benchrun.WithDB(s.admin, db)
	a, err := benchrun.NewMerchant(ctx, "", database)
	if err != nil {
		return modeResult{}, err
	}
	b, err := benchrun.NewMerchant(ctx, "", database)
	if err != nil {
		return modeResult{}, err
	}
	env := append([]string{"NATS_URL=" + natsURL, "RELAY_ENABLED=true", "METRICS_SAMPLE=15s", "CHARGE_EXPIRY_INTERVAL=1s"}, m.env...)
	if sc.svc, err = benchrun.Start(ctx, "", database, filepath.Join(s.out, "service-"+m.tag+".log"), env...); err != nil {
		return modeResult{}, err
	}
	w := &isoWorld{url: sc.svc.URL, database: database, a: a, b: b}
	if err := w.open(ctx); err != nil {
		return modeResult{}, err
	}
	res := modeResult{mode: m}
	for round := 1; round <= s.rounds; round++ {
		for _, readers := range []int{0, s.readers} {
			if err := benchrun.Exec(ctx, database, "CHECKPOINT"); err != nil {
				return modeResult{}, err
			}
			p := w.phase(ctx, s.chargers, readers, s.rate, time.Duration(s.seconds)*time.Second)
			p.round = round
			logger.Printf("%s, round %d: %s", m.name, round, p.line())
			res.phases = append(res.phases, p)
		}
	}
	if m.holds {
		h, err := w.expireHolds(ctx, s.holds, s.chargers, s.rate, natsURL)
		if err != nil {
			return modeResult{}, err
		}
		logger.Printf("%s: %s", m.name, h.line())
		res.holds = &h
	}
	return res, ctx.Err()
}

// Where the section goes: its own markers, before bench-sync's when it is
// new; its notes, written by hand between <!-- bench-isolation-notes:begin
// --> and its end, are kept by every run.
const (
	isoBegin = "<!-- bench-isolation:begin -->"
	isoEnd   = "<!-- bench-isolation:end -->"
)

// writeIsoSection replaces the section in the file at path, keeping its
// notes.
func writeIsoSection(path, section string) error {
	old, _ := os.ReadFile(path) // none: no notes, and writeMarkedSection creates it
	return writeMarkedSection(path, isoBegin, isoEnd, syncBegin,
		withNotes(isoBegin+"\n"+section+isoEnd+"\n", string(old), "bench-isolation-notes", isoEnd))
}
