package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// runBatchCost is make batch-cost: what a charge batch costs,
// apart from what each charge in it adds.
//
// For each client count: a new database, `payments serve` (bin/payments,
// built from the working tree) with the relay off, a warm-up second, a
// CHECKPOINT, then paymentsbench's fresh scenario with -cpu. The batches
// come from payments_charge_batches_total around the run. It prints a
// table on stdout, a row per client count: charges/s, charges per batch,
// and the CPU time per batch and per charge of PostgreSQL, the service and
// the whole machine. With one client every batch is one charge, so the
// rows together separate a batch's fixed cost from a charge's.
//
// Environment:
//
//	COST_CLIENTS   client counts (default "1 4 16")
//	COST_SECONDS   seconds per run (default 10)
//	COST_ACCOUNTS  accounts the charges spread over (default 1000)
//	COST_RELAY     off (default), or on: the relay publishes to NATS_URL
//	NATS_URL       the relay's NATS (default nats://127.0.0.1:4222)
//	PAYMENTS_TEST_DATABASE_URL  a PostgreSQL where this may CREATE DATABASE
//	               (default postgres://postgres@127.0.0.1:5432/postgres)
//	GO             the go command (default go)
func runBatchCost(ctx context.Context, logger *log.Logger) error {
	s, err := readCostSettings()
	if err != nil {
		return err
	}
	out, err := benchrun.BuildCurrent(ctx, s.goBin)
	_, _ = os.Stderr.Write(out)
	if err != nil {
		return err
	}
	c := &batchCost{costSettings: s, stdout: os.Stdout, log: logger, tck: clockTicks()}
	defer c.cleanup(ctx)
	err = c.run(ctx)
	if err != nil && ctx.Err() != nil {
		// Returned after the deferred cleanup has run.
		return fmt.Errorf("interrupted (%w); cleaned up", err)
	}
	return err
}

// costSettings are the environment of batch-cost.
type costSettings struct {
	admin, natsURL, goBin string
	clients               []int
	seconds, accounts     int
	relay                 bool
}

// readCostSettings reads the environment; it fails on a malformed value.
func readCostSettings() (costSettings, error) {
	s := costSettings{
		admin:   benchrun.Getenv("PAYMENTS_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
		natsURL: benchrun.Getenv("NATS_URL", defaultNATSURL),
		goBin:   benchrun.Getenv("GO", "go"),
	}
	var errs []error
	var err error
	s.clients, err = benchrun.Counts("COST_CLIENTS", "1 4 16")
	errs = append(errs, err)
	s.seconds, err = benchrun.PositiveInt("COST_SECONDS", 10, 1)
	errs = append(errs, err)
	s.accounts, err = benchrun.PositiveInt("COST_ACCOUNTS", 1000, 1)
	errs = append(errs, err)
	switch v := benchrun.Getenv("COST_RELAY", "off"); v {
	case "on":
		s.relay = true
	case "off":
	default:
		errs = append(errs, fmt.Errorf(`COST_RELAY must be "on" or "off", got %q`, v))
	}
	return s, errors.Join(errs...)
}

// batchCost is one run's state: what it started, so that cleanup stops it.
type batchCost struct {
	costSettings
	stdout  io.Writer
	log     *log.Logger
	tck     int
	logPath string // the service's log, one at a time
	scratch        // the client count under way
}

// run prints the table's head, then measures each client count and prints
// its row.
func (c *batchCost) run(ctx context.Context) error {
	f, err := os.CreateTemp("", "batch-cost.")
	if err != nil {
		return err
	}
	c.logPath = f.Name()
	_ = f.Close()
	fmt.Fprint(c.stdout, costHeader)
	for _, n := range c.clients {
		row, err := c.measure(ctx, n)
		if err != nil {
			return err
		}
		fmt.Fprint(c.stdout, row)
	}
	return os.Remove(c.logPath)
}

// costHeader is the table's head.
const costHeader = "| clients | charges/s | charges per batch | PostgreSQL ms per batch | per charge | service ms per batch | per charge | machine ms per charge |\n" +
	"|---:|---:|---:|---:|---:|---:|---:|---:|\n"

// measure is the row of one client count.
func (c *batchCost) measure(ctx context.Context, clients int) (string, error) {
	c.db = fmt.Sprintf("batch_cost_%d_%d", os.Getpid(), clients)
	if err := benchrun.CreateDB(ctx, c.admin, c.db); err != nil {
		return "", fmt.Errorf("create database %s: %w", c.db, err)
	}
	database := benchrun.WithDB(c.admin, c.db)
	merchant, err := benchrun.NewMerchant(ctx, "", database)
	if err != nil {
		return "", err
	}
	// METRICS_SAMPLE as shipped (Start samples every second for make bench).
	c.svc, err = benchrun.Start(ctx, "", database, c.logPath, "NATS_URL="+c.natsURL,
		"METRICS_SAMPLE=15s", "RELAY_ENABLED="+strconv.FormatBool(c.relay))
	if err != nil {
		return "", err
	}
	load := []string{"-url", c.svc.URL, "-c", strconv.Itoa(clients), "-accounts", strconv.Itoa(c.accounts), "-scenarios", "fresh"}
	if _, err := paymentsbench(ctx, merchant.APIKey, os.Stderr, append(load, "-d", "1s")...); err != nil {
		return "", fmt.Errorf("warm-up at %d clients: %w", clients, err)
	}
	if err := benchrun.Exec(ctx, database, "CHECKPOINT"); err != nil {
		return "", err
	}
	before, err := c.batches(ctx)
	if err != nil {
		return "", err
	}
	out, err := paymentsbench(ctx, merchant.APIKey, os.Stderr, append(load, "-d", fmt.Sprintf("%ds", c.seconds),
		"-json", "-cpu", "-service-pid", strconv.Itoa(c.svc.PID))...)
	if err != nil {
		return "", fmt.Errorf("%d clients: %w", clients, err)
	}
	after, err := c.batches(ctx)
	if err != nil {
		return "", err
	}
	runs, err := parsePairResults(out)
	if err != nil {
		return "", fmt.Errorf("%d clients: %w", clients, err)
	}
	if len(runs) == 0 {
		return "", fmt.Errorf("%d clients: paymentsbench gave no result", clients)
	}
	c.cleanup(ctx)
	return costRow(clients, runs[0], after-before, c.tck), nil
}

// batches is the service's count of charge batches so far.
func (c *batchCost) batches(ctx context.Context) (float64, error) {
	m, err := benchrun.Scrape(ctx, c.svc.MetricsURL, "payments_charge_batches_total")
	return m["payments_charge_batches_total"], err
}

// costRow is the row of a run at clients that made batches batches: per
// batch and per charge, three decimals; a dash where a count is 0.
func costRow(clients int, r pairResult, batches float64, tck int) string {
	per := func(v, n float64) string { return cell(roundTo(v/n, 3), n > 0) }
	ms := func(part string) float64 { return 1000 * r.CPUTicks[part] / float64(tck) }
	return fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s | %s |\n", clients, number(r.ChargesPerS),
		per(r.Charges, batches), per(ms("postgres"), batches), per(ms("postgres"), r.Charges),
		per(ms("service"), batches), per(ms("service"), r.Charges), per(ms("machine"), r.Charges))
}

// cleanup stops the service and drops the database of the client count
// under way; it runs on every exit, an interrupted one too, so it does
// not use ctx's cancellation. An interrupted run's service log goes too;
// a failed run's stays, for its error names it.
func (c *batchCost) cleanup(ctx context.Context) {
	if ctx.Err() != nil && c.logPath != "" {
		defer os.Remove(c.logPath)
	}
	c.end(ctx, c.admin, c.log)
}
