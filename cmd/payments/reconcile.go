package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/reconcile"
)

// exitMismatches is the exit status of a reconciliation that found
// mismatches; any other failure exits 1 (main).
const exitMismatches = 2

// mismatchesError is a reconciliation that ran, was recorded and printed,
// and found references that disagree: main exits with exitMismatches.
type mismatchesError struct{ n int }

func (e mismatchesError) Error() string {
	return fmt.Sprintf("reconcile: %d references disagree with the processor (listed on stdout)", e.n)
}

// ExitCode is the process's exit status for it.
func (mismatchesError) ExitCode() int { return exitMismatches }

// exitCode is the exit status of run's error err: 0 for none, a
// reconciliation's mismatches' own, else 1.
func exitCode(err error) int {
	var coded interface{ ExitCode() int }
	switch {
	case err == nil:
		return 0
	case errors.As(err, &coded):
		return coded.ExitCode()
	}
	return 1
}

// defaultSettle is --settle's default: well past the recovery of an
// operation at the simulator's decision deadline (120 s).
const defaultSettle = 10 * time.Minute

// reconcileCommand compares our card charges with the processor's records
// over [--since, --until) (reconcile.Reconcile), prints a line per
// reference as JSON or CSV, and records the run for serve's metrics. It
// returns mismatchesError when references disagree.
func reconcileCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const cmd = "reconcile"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	sinceFlag := fs.String("since", "", "start of the window (RFC 3339, or a date YYYY-MM-DD meaning its midnight UTC; required): "+
		"the operations we created and the payments the processor created from then on")
	untilFlag := fs.String("until", "", "end of the window, excluded (RFC 3339 or YYYY-MM-DD; default now)")
	format := fs.String("format", "json", "json (one document: the run, its counts, a line per reference) or csv (a row per reference)")
	settle := fs.Duration("settle", defaultSettle, "an operation created or changed less than this before now is pending, not judged")
	load := addSettings(fs, cmd, getenv)
	if err := parseFlags(fs, args, commandNamed(cmd).usage(), stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", cmd, fs.Arg(0))
	}
	write := map[string]func(io.Writer, reconcile.Report) error{"json": reconcile.WriteJSON, "csv": reconcile.WriteCSV}[*format]
	if write == nil {
		return fmt.Errorf("%s: --format must be json or csv, not %q", cmd, *format)
	}
	now := time.Now()
	since, until, err := reconcileWindow(*sinceFlag, *untilFlag, now)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if *settle < 0 {
		return fmt.Errorf("%s: --settle must not be negative", cmd)
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	name, records, err := reconcileRecords(ctx, cfg, stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	store, err := openAdmin(ctx, func() (config, error) { return cfg, nil })
	if err != nil {
		return err
	}
	defer store.Close()
	// A payment may be created up to the decision deadline after our
	// operation (a re-drive): the processor's records are read that far
	// past the window.
	report, err := reconcile.Reconcile(ctx, store.Reconciliations, records, name, since, until,
		reconcile.Options{Settle: *settle, Lag: cfg.Processor.DecisionDeadline + cfg.Processor.Timeout})
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if err := write(stdout, report); err != nil {
		return fmt.Errorf("%s: write the report: %w", cmd, err)
	}
	if n := report.Mismatches(); n > 0 {
		return mismatchesError{n}
	}
	return nil
}

// reconcileRecords returns the records of the processor PROCESSOR names,
// and its name (processor.Processor.Name: only its operations are
// compared), each call bounded by PROCESSOR_TIMEOUT. Stripe's adapter logs
// its refusals to stderr. It returns an error when there is none.
func reconcileRecords(ctx context.Context, cfg config, stderr io.Writer) (string, processor.Records, error) {
	p, err := openProcessor(ctx, cfg.Processor, &http.Client{Timeout: cfg.Processor.Timeout}, slog.New(slog.NewJSONHandler(stderr, nil)))
	switch {
	case err != nil:
		return "", nil, err
	case p == nil:
		return "", nil, errors.New("no card processor is configured (PROCESSOR, PROCESSOR_URL): there is nothing to reconcile with")
	}
	return p.Name(), p, nil
}

// reconcileWindow parses --since and --until (empty: now) and checks that
// they make a window that has begun.
func reconcileWindow(sinceText, untilText string, now time.Time) (since, until time.Time, err error) {
	if sinceText == "" {
		return since, until, errors.New("--since is required (RFC 3339, or a date YYYY-MM-DD)")
	}
	if since, err = parseInstant(sinceText); err != nil {
		return since, until, fmt.Errorf("--since: %w", err)
	}
	until = now
	if untilText != "" {
		if until, err = parseInstant(untilText); err != nil {
			return since, until, fmt.Errorf("--until: %w", err)
		}
	}
	if !since.Before(until) {
		return since, until, fmt.Errorf("--since (%s) must be before --until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	if since.After(now) {
		return since, until, fmt.Errorf("--since (%s) is in the future", since.Format(time.RFC3339))
	}
	return since, until, nil
}

// parseInstant reads an RFC 3339 time, or a date (its midnight UTC).
func parseInstant(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-12-05T00:00:00Z) nor a date (2026-12-05)", s)
}

// reconcileSampler reads the newest reconciliation run on the monitor's
// connection, for serve's gauges.
func reconcileSampler(monitor *postgres.Monitor) func(context.Context) (metrics.ReconcileSample, error) {
	return func(ctx context.Context) (metrics.ReconcileSample, error) {
		last, ok, err := monitor.LastReconciliation(ctx)
		return metrics.ReconcileSample{Ran: ok, Mismatches: last.Mismatches, FinishedAt: last.FinishedAt}, err
	}
}
