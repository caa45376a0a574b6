package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// syncMember is a member of the HA cluster as ./scripts/ha.sh primary or
// standby prints it: "pg1 5441".
type syncMember struct{ name, port string }

// admin is the URL of the member's postgres database, the member alone.
func (m syncMember) admin() string {
	return "postgres://postgres@127.0.0.1:" + m.port + "/postgres?sslmode=disable"
}

// syncCluster is the HA cluster as the run found it.
type syncCluster struct {
	url              string // the multi-host DATABASE_URL ha.sh up prints
	primary, standby syncMember
}

// haScript runs ./scripts/ha.sh with args, env added to its environment,
// and returns its stdout, trimmed; its stderr goes to ours unless quiet.
func haScript(ctx context.Context, env []string, quiet bool, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "./scripts/ha.sh", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	if quiet {
		cmd.Stderr = io.Discard
	}
	// ha.sh's children may hold its stdout after it is killed.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("./scripts/ha.sh %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// haMember is the cluster's primary or its synchronous standby (role).
func haMember(ctx context.Context, role string, quiet bool) (syncMember, error) {
	out, err := haScript(ctx, nil, quiet, role)
	f := strings.Fields(out)
	if err != nil || len(f) != 2 {
		return syncMember{}, fmt.Errorf("the HA cluster has no %s (./scripts/ha.sh status)", role)
	}
	return syncMember{name: f[0], port: f[1]}, nil
}

// setUpCluster starts the HA cluster if it is not running, creates the
// scratch database on its primary and on the single server, and waits
// until the standby has it.
func (s *syncRun) setUpCluster(ctx context.Context) error {
	s.log.Print("make ha-up (starts the HA cluster if it is not running)")
	var err error
	if s.cluster.url, err = haScript(ctx, nil, false, "up"); err != nil {
		return err
	}
	if s.cluster.primary, err = haMember(ctx, "primary", false); err != nil {
		return err
	}
	if s.cluster.standby, err = haMember(ctx, "standby", false); err != nil {
		return err
	}
	p, sb := s.cluster.primary, s.cluster.standby
	s.log.Printf("primary %s (%s), synchronous standby %s (%s)", p.name, p.port, sb.name, sb.port)
	// Interrupted, a CREATE DATABASE may have happened anyway: drop it too.
	err = benchrun.CreateDB(ctx, p.admin(), s.db)
	s.haCreated = err == nil || ctx.Err() != nil
	if err != nil {
		return fmt.Errorf("cannot create %s on the cluster's primary: %w", s.db, err)
	}
	err = benchrun.CreateDB(ctx, s.localAdmin, s.db)
	s.localCreated = err == nil || ctx.Err() != nil
	if err != nil {
		return fmt.Errorf("cannot create a database with %s; set PAYMENTS_BENCH_DATABASE_URL: %w",
			benchrun.Redact(s.localAdmin), err)
	}
	// pgx stops at a standby that answers "database does not exist", so the
	// multi-host URL is used only once the standby has the database.
	if err := syncAwaitDB(ctx, sb.admin(), s.db, 30*time.Second); err != nil {
		return err
	}
	s.haDB = benchrun.WithDB(s.cluster.url, s.db)    // the service's, as deployed
	s.haPrimaryDB = benchrun.WithDB(p.admin(), s.db) // ALTER DATABASE, CHECKPOINT, statistics
	s.localDB = benchrun.WithDB(s.localAdmin, s.db)
	return nil
}

// syncAwaitDB waits until database db exists on admin's server.
func syncAwaitDB(ctx context.Context, admin, db string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n, err := benchrun.Value(ctx, admin, "SELECT count(*)::text FROM pg_database WHERE datname = $1", db)
		if err == nil && n == "1" {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not have database %s within %s", db, within)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkCluster fails unless the cluster is healthy, with the primary it
// had at the start and the same standby synchronous: otherwise the rounds
// would not be comparable.
func (s *syncRun) checkCluster(ctx context.Context) error {
	if _, err := haScript(ctx, []string{"HA_WAIT=30"}, false, "wait"); err != nil {
		return fmt.Errorf("the HA cluster is not healthy (./scripts/ha.sh status): %w", err)
	}
	p, err := haMember(ctx, "primary", false)
	if err != nil {
		return err
	}
	if p != s.cluster.primary {
		return fmt.Errorf("the primary moved during the run (%s, was %s): the rounds are not comparable",
			p.name, s.cluster.primary.name)
	}
	state, err := benchrun.Value(ctx, p.admin(),
		"SELECT coalesce(string_agg(application_name || ' ' || sync_state, ', '), '') FROM pg_stat_replication")
	if err != nil {
		return fmt.Errorf("pg_stat_replication on the primary: %w", err)
	}
	if want := s.cluster.standby.name + " sync"; state != want {
		return fmt.Errorf("pg_stat_replication on the primary: '%s', not '%s'", state, want)
	}
	return nil
}

// setSyncLocal makes the cluster's commits in the scratch database stop
// waiting for the standby (configuration B), and checks that a new session
// sees it.
func (s *syncRun) setSyncLocal(ctx context.Context) error {
	alter := "ALTER DATABASE " + pgx.Identifier{s.db}.Sanitize() + " SET synchronous_commit = local"
	if err := benchrun.Exec(ctx, s.haPrimaryDB, alter); err != nil {
		return err
	}
	v, err := benchrun.Value(ctx, s.haPrimaryDB, "SHOW synchronous_commit")
	if err != nil {
		return fmt.Errorf("SHOW synchronous_commit in a new session: %w", err)
	}
	if v != "local" {
		return fmt.Errorf("ALTER DATABASE %s SET synchronous_commit = local did not reach a new session (it shows %q)", s.db, v)
	}
	return nil
}

// syncResetCommit undoes setSyncLocal.
func syncResetCommit(db string) string {
	return "ALTER DATABASE " + pgx.Identifier{db}.Sanitize() + " RESET synchronous_commit"
}

// syncSetting is one setting on both servers.
type syncSetting struct{ Name, Primary, Single string }

// syncSettings is what differs between the two servers.
type syncSettings struct {
	shown                 []syncSetting
	otherDiffs            string // the names of the other settings that differ, "" for none
	version, versionLocal string
}

// syncShown are the settings that could matter, shown side by side.
var syncShown = []string{"fsync", "synchronous_commit", "synchronous_standby_names", "wal_level", "wal_log_hints",
	"wal_sync_method", "full_page_writes", "wal_compression", "commit_delay", "max_wal_size", "checkpoint_timeout",
	"shared_buffers", "max_connections", "autovacuum"}

// syncShowAll is SHOW of each setting of $1, one a line, in its order.
const syncShowAll = `SELECT string_agg(current_setting(n), E'\n' ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS t(n, i)`

// syncAllSettings is every setting as name=value, one a line, but those
// that must differ (paths, ports, the replication connection).
const syncAllSettings = `SELECT string_agg(name || '=' || setting, E'\n' ORDER BY name) FROM pg_settings WHERE name NOT IN
  ('port', 'data_directory', 'config_file', 'hba_file', 'ident_file', 'external_pid_file', 'unix_socket_directories',
   'listen_addresses', 'cluster_name', 'log_directory', 'log_filename', 'primary_conninfo', 'primary_slot_name',
   'ssl_cert_file', 'ssl_key_file', 'shared_memory_size', 'shared_memory_size_in_huge_pages')`

// readSyncSettings reads the settings of the cluster's primary and the
// single server.
func readSyncSettings(ctx context.Context, primary, single string) (syncSettings, error) {
	var both [2][]string
	var all [2]string
	var versions [2]string
	for i, admin := range []string{primary, single} {
		shown, err := benchrun.Value(ctx, admin, syncShowAll, syncShown)
		if err != nil {
			return syncSettings{}, fmt.Errorf("read the settings: %w", err)
		}
		if both[i] = strings.Split(shown, "\n"); len(both[i]) != len(syncShown) {
			return syncSettings{}, fmt.Errorf("read the settings: %d values for %d names", len(both[i]), len(syncShown))
		}
		if all[i], err = benchrun.Value(ctx, admin, syncAllSettings); err != nil {
			return syncSettings{}, fmt.Errorf("read the settings: %w", err)
		}
		if versions[i], err = benchrun.Value(ctx, admin, "SHOW server_version"); err != nil {
			return syncSettings{}, err
		}
	}
	st := syncSettings{version: versions[0], versionLocal: versions[1],
		otherDiffs: syncOtherDiffs(strings.Split(all[0], "\n"), strings.Split(all[1], "\n"), syncShown)}
	for i, name := range syncShown {
		st.shown = append(st.shown, syncSetting{Name: name, Primary: both[0][i], Single: both[1][i]})
	}
	return st, nil
}

// syncOtherDiffs names the settings whose name=value line is in only one
// of a and b, those in shown aside: "log_line_prefix, ssl", sorted.
func syncOtherDiffs(a, b, shown []string) string {
	names := map[string]bool{}
	for _, pair := range [][2][]string{{a, b}, {b, a}} {
		for _, line := range pair[0] {
			name, _, _ := strings.Cut(line, "=")
			if line != "" && !slices.Contains(pair[1], line) && !slices.Contains(shown, name) {
				names[name] = true
			}
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	return strings.Join(sorted, ", ")
}
