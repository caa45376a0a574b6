package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// runSync is make bench-sync: the cost of synchronous replication, fresh
// charges with a synchronous standby against a single server, written into
// the section "Synchronous replication: what does waiting for the standby
// cost?" of docs/benchmarks.md, between <!-- bench-sync:begin --> and
// <!-- bench-sync:end --> (make bench keeps that section as it is).
//
// Three configurations, the same binaries and the same load:
//
//	A  the service on the HA cluster (./scripts/ha.sh up, which starts it if
//	   it is not running and leaves it running), through its multi-host
//	   DATABASE_URL: every commit waits for the synchronous standby;
//	B  the same cluster and database with
//	   ALTER DATABASE <db> SET synchronous_commit = local (reset after each
//	   run): commits do not wait for the standby, which still streams;
//	C  the single local PostgreSQL (PAYMENTS_BENCH_DATABASE_URL).
//
// Each gets a scratch database (syncbench_<pid>, from template0 with the C
// locale; dropped on exit, interrupted or not). In every round each
// configuration in turn gets a CHECKPOINT on its server, a fresh service,
// bin/paymentsbench's fresh scenario at each client count, then
// pg-reference on the same server at the same counts (for B with
// PGOPTIONS='-c synchronous_commit=local'). The order alternates, A B C then
// C B A, so drift on a shared machine falls on all three. The report gives
// each figure's median over the rounds, and medians of the ratios taken
// within a round. Files: bin/bench-sync-results.jsonl (the load
// generator's JSON lines), bin/bench-sync-pgref.txt (pg-reference's runs),
// bin/bench-sync-server-CONFIG-rROUND.log, bin/bench-sync-others-SERVER.txt.
//
// Environment:
//
//	BENCH_SECONDS        seconds per run, service and pg-reference (default 10)
//	BENCH_SYNC_ROUNDS    rounds (default 6)
//	BENCH_SYNC_CLIENTS   client counts (default "16 1")
//	BENCH_REPORT         the file whose section is rewritten (default docs/benchmarks.md)
//	PAYMENTS_BENCH_DATABASE_URL  the single server, where this may CREATE DATABASE
//	                     (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
//	GO                   the go command that builds the binaries (default go)
//
// It fails when the cluster is not healthy before a round, when its primary
// moved or its standby is not synchronous, or when a run's balances did
// not match (after writing the section).
func runSync(ctx context.Context, logger *log.Logger) error {
	cfg, err := syncConfigFromEnv()
	if err != nil {
		return err
	}
	if err := cfg.check(); err != nil {
		return err
	}
	s, err := newSyncRun(cfg, logger)
	if err != nil {
		return err
	}
	defer s.cleanup(ctx)
	err = s.run(ctx)
	if err != nil && ctx.Err() != nil {
		// Returned after the deferred cleanup has run.
		return fmt.Errorf("interrupted (%w); cleaned up", err)
	}
	return err
}

// run sets up, measures and writes the section.
func (s *syncRun) run(ctx context.Context) error {
	if err := s.setUpCluster(ctx); err != nil {
		return err
	}
	if err := s.setUpService(ctx); err != nil {
		return err
	}
	if err := s.runRounds(ctx); err != nil {
		return err
	}
	section, err := s.section(ctx)
	if err != nil {
		return err
	}
	if err := writeSyncSection(s.report, section); err != nil {
		return fmt.Errorf("write %s: %w", s.report, err)
	}
	s.log.Printf("wrote the section of %s in %ds", s.report, s.elapsed)
	fmt.Fprint(os.Stderr, syncSummaryTable(section))
	if len(s.lost) > 0 {
		s.log.Printf("WARNING: runs without a result: %s", strings.Join(s.lost, " "))
	}
	if len(s.loadgen.Failed) > 0 {
		return fmt.Errorf("balances did not match in: %s (see %s)", strings.Join(s.loadgen.Failed, " "), syncResultsPath)
	}
	return nil
}

// The files a run leaves in bin/.
const (
	syncResultsPath = "bin/bench-sync-results.jsonl"
	syncPgrefPath   = "bin/bench-sync-pgref.txt"
)

// syncConfig is the environment of a run.
type syncConfig struct {
	seconds, rounds int
	clients         []int
	report          string
	localAdmin      string
	goBin           string
}

// syncConfigFromEnv reads the environment; it fails on a malformed value.
func syncConfigFromEnv() (syncConfig, error) {
	c := syncConfig{
		report:     benchrun.Getenv("BENCH_REPORT", "docs/benchmarks.md"),
		localAdmin: benchrun.Getenv("PAYMENTS_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		goBin:      benchrun.Getenv("GO", "go"),
	}
	var err error
	if c.seconds, err = benchrun.PositiveInt("BENCH_SECONDS", 10, 1); err != nil {
		return c, err
	}
	if c.rounds, err = benchrun.PositiveInt("BENCH_SYNC_ROUNDS", 6, 1); err != nil {
		return c, err
	}
	c.clients, err = benchrun.Counts("BENCH_SYNC_CLIENTS", "16 1")
	return c, err
}

// check fails when a tool the run needs is missing.
func (c syncConfig) check() error {
	if _, err := benchrun.SharedDir(); err != nil {
		return err
	}
	return benchrun.RequireTools(c.goBin, "psql", "pgbench")
}

// clientList is the client counts as the report writes them: "16 1".
func (c syncConfig) clientList() string {
	words := make([]string, len(c.clients))
	for i, n := range c.clients {
		words[i] = fmt.Sprint(n)
	}
	return strings.Join(words, " ")
}

// syncRun is one make bench-sync: what it started, so that cleanup stops
// it, and what it measured.
type syncRun struct {
	syncConfig
	log        *log.Logger
	db         string // the scratch database's name, on both servers
	tmp        string
	began      time.Time
	loadBefore string
	elapsed    int

	cluster                    syncCluster
	haDB, haPrimaryDB, localDB string
	haKey, localKey            string
	haCreated, localCreated    bool
	settings                   syncSettings

	service *benchrun.Service
	nats    *benchrun.NATS
	watches map[string]*benchrun.Watch
	results *benchrun.Results
	loadgen *benchrun.Loadgen
	ref     *benchrun.Reference
	lost    []string // runs without a result
}

// newSyncRun starts the result files empty and removes the previous
// run's logs.
func newSyncRun(cfg syncConfig, logger *log.Logger) (*syncRun, error) {
	s := &syncRun{syncConfig: cfg, log: logger, db: fmt.Sprintf("syncbench_%d", os.Getpid()),
		began: time.Now(), loadBefore: benchrun.LoadAverage(3), watches: map[string]*benchrun.Watch{}}
	if err := os.MkdirAll("bin", 0o755); err != nil {
		return nil, err
	}
	var err error
	if s.results, err = benchrun.NewResults(syncResultsPath); err != nil {
		return nil, err
	}
	if err := os.WriteFile(syncPgrefPath, nil, 0o644); err != nil {
		return nil, err
	}
	for _, pattern := range []string{"bin/bench-sync-server-*.log", "bin/bench-*.err"} {
		old, _ := filepath.Glob(pattern)
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	s.loadgen = &benchrun.Loadgen{Results: s.results}
	shared, err := benchrun.SharedDir()
	if err != nil {
		return nil, err
	}
	if s.tmp, err = os.MkdirTemp("", "bench-sync-"); err != nil {
		return nil, err
	}
	if s.ref, err = benchrun.NewReference(shared, cfg.seconds, s.tmp); err != nil {
		_ = os.RemoveAll(s.tmp)
		return nil, err
	}
	return s, nil
}

// setUpService builds the binaries, creates a merchant in each scratch
// database, starts the run's NATS, reads the servers' settings and starts
// watching their other users.
func (s *syncRun) setUpService(ctx context.Context) error {
	s.log.Print("building bin/payments and bin/paymentsbench")
	out, err := benchrun.BuildCurrent(ctx, s.goBin)
	_, _ = os.Stderr.Write(out)
	if err != nil {
		return err
	}
	ha, err := benchrun.NewMerchant(ctx, "", s.haDB)
	if err != nil {
		return err
	}
	local, err := benchrun.NewMerchant(ctx, "", s.localDB)
	if err != nil {
		return err
	}
	s.haKey, s.localKey = ha.APIKey, local.APIKey
	s.nats, err = benchrun.StartNATS(ctx)
	switch {
	case errors.Is(err, benchrun.ErrNoNATSServer):
		s.log.Print(err)
	case err != nil:
		return err
	default:
		s.log.Printf("private NATS (JetStream) at %s for the relay", s.nats.URL)
	}
	if s.settings, err = readSyncSettings(ctx, s.cluster.primary.admin(), s.localAdmin); err != nil {
		return err
	}
	return s.startWatches(ctx)
}

// syncOthersQuery counts the sessions active in databases that are not
// this run's (its scratch database, pg-reference's): the other users of a
// server.
const syncOthersQuery = `SELECT count(*) FILTER (WHERE state = 'active'
  AND backend_type = 'client backend' AND pid <> pg_backend_pid()
  AND datname NOT LIKE 'syncbench%' AND datname NOT LIKE 'payments_reference%') FROM pg_stat_activity`

// startWatches samples the other users of each server every second, into
// bin/bench-sync-others-SERVER.txt ("unix_ms count" lines).
func (s *syncRun) startWatches(ctx context.Context) error {
	for name, admin := range map[string]string{"cluster": s.cluster.primary.admin(), "single": s.localAdmin} {
		w, err := benchrun.StartWatch(ctx, admin, syncOthersQuery, syncOthersPath(name), time.Second)
		if err != nil {
			return fmt.Errorf("watch the other users of the %s server: %w", name, err)
		}
		s.watches[name] = w
	}
	return nil
}

func syncOthersPath(server string) string { return "bin/bench-sync-others-" + server + ".txt" }

// stopWatches ends the samplers; their files are complete after it.
func (s *syncRun) stopWatches() {
	for name, w := range s.watches {
		w.Stop()
		delete(s.watches, name)
	}
}

// cleanup stops what the run started and drops its scratch databases; it
// runs on every exit, an interrupted one too, so it does not use ctx's
// cancellation.
func (s *syncRun) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s.service.Stop()
	s.service = nil
	s.stopWatches()
	if s.haCreated {
		admin := s.cluster.primary.admin()
		// A failover during the run moved the database with the primary.
		if p, err := haMember(ctx, "primary", true); err == nil {
			admin = p.admin()
		}
		_ = benchrun.Exec(ctx, admin, syncResetCommit(s.db))
		if err := benchrun.DropDB(ctx, admin, s.db); err != nil {
			s.log.Printf("could not drop %s on the cluster's primary: %v", s.db, err)
		}
	}
	if s.localCreated {
		if err := benchrun.DropDB(ctx, s.localAdmin, s.db); err != nil {
			s.log.Printf("could not drop %s on the single server: %v", s.db, err)
		}
	}
	s.nats.Stop()
	s.nats = nil
	_ = os.RemoveAll(s.tmp)
}
