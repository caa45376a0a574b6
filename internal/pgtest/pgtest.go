// Package pgtest gives integration tests real PostgreSQL databases: one
// migrated database per test package (pgtest.Main in TestMain, DatabaseURL in
// tests), and a private copy of its template for a test that needs one
// (NewDatabase). The server is PAYMENTS_TEST_DATABASE_URL if set, else a
// container from a Docker-compatible engine (testcontainers-go, image
// PAYMENTS_TEST_POSTGRES_IMAGE), else trust-auth PostgreSQL on 127.0.0.1:5432.
// A source that is chosen and fails fails the package; none at all fails it
// with a message naming the three. PostgreSQL 13 or newer.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

const (
	// adminTimeout bounds one admin statement (CREATE or DROP DATABASE) and the
	// connection it runs on.
	adminTimeout = 30 * time.Second
	// teardownTimeout bounds dropping the package's databases and stopping the
	// container after the tests.
	teardownTimeout = 2 * time.Minute
)

// current is the package's test suite. Main sets it before the tests run and
// never changes it afterwards, so tests read it without locking.
var current *suite

// suite is what Main provisions for one test package: a migrated template
// database, the package database copied from it, and the admin URL of their server.
type suite struct {
	adminURL    string
	prefix      string // every database of the package is named prefix or prefix_<suffix>
	template    string // the migrated template database; nobody may connect to it
	database    string // the package database
	databaseURL string
	seq         atomic.Int64 // numbers the databases NewDatabase creates
}

// Main provisions a PostgreSQL server and a fresh, migrated database for the test
// package, runs its tests, drops the package's databases, stops any container it
// started, and exits with the tests' exit code. Call it from the package's TestMain.
//
// It prints one line to stdout naming the server it used. If no server is
// available, migrating fails, or cleaning up fails, it prints why to stderr and
// exits with code 1. On SIGINT or SIGTERM it cleans up before exiting.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit: it returns the exit code, so that a TestMain
// with its own set-up and teardown around the tests can call it.
func Run(m *testing.M) int {
	// A fuzzing worker runs only fuzz targets, which need no database, and is
	// killed when fuzzing ends: provisioning there would leave databases behind.
	flag.Parse()
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), provisionTimeout)
	defer cancel()

	srv, err := provision(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	s, err := newSuite(ctx, srv.adminURL, packageName())
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", errors.Join(err, srv.close()))
		return 1
	}
	fmt.Printf("pgtest: %s; database %s\n", srv.description, s.database)
	current = s

	var (
		teardownOnce sync.Once
		teardownErr  error
	)
	teardown := func() error {
		teardownOnce.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
			defer cancel()
			teardownErr = errors.Join(s.drop(ctx), srv.close())
		})
		return teardownErr
	}
	stopSignals := onSignal(func(sig os.Signal) {
		fmt.Fprintf(os.Stderr, "pgtest: %v: cleaning up\n", sig)
		if err := teardown(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: clean up: %v\n", err)
		}
		os.Exit(1)
	})

	code := m.Run()

	stopSignals()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: clean up: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// onSignal calls f once if the process receives SIGINT or SIGTERM, so that an
// interrupted run does not leave its databases or container behind. A second
// signal kills the process as usual. The returned function stops watching.
func onSignal(f func(os.Signal)) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		signal.Reset(os.Interrupt, syscall.SIGTERM)
		f(sig)
	}()
	return func() {
		signal.Stop(sigs)
		close(sigs)
	}
}

// DatabaseURL returns the URL of the test package's migrated database, which all
// of the package's tests share. It fails the test if the package's TestMain does
// not call Main.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	return mustSuite(t, "DatabaseURL").databaseURL
}

// NewDatabase creates a further migrated database for the calling test alone and
// returns its URL. The database is dropped when the test and its subtests end,
// even if connections to it are still open. It fails the test if the database
// cannot be created or if the package's TestMain does not call Main.
func NewDatabase(t testing.TB) string {
	t.Helper()
	s := mustSuite(t, "NewDatabase")
	return s.newDatabase(t, s.clone)
}

// NewEmptyDatabase is NewDatabase without the service's schema: an empty
// UTF8 database for a program with tables of its own (the processor
// simulator), named and dropped as NewDatabase's are.
func NewEmptyDatabase(t testing.TB) string {
	t.Helper()
	s := mustSuite(t, "NewEmptyDatabase")
	return s.newDatabase(t, func(ctx context.Context, name string) error {
		if err := adminExec(ctx, s.adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" "+migrations.CreateDatabaseOptions); err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
		return nil
	})
}

// newDatabase names a database of the calling test, has create make it,
// and drops it when the test ends; it returns its URL.
func (s *suite) newDatabase(t testing.TB, create func(ctx context.Context, name string) error) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", s.prefix, s.seq.Add(1))
	u, err := withDatabase(s.adminURL, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), adminTimeout)
	defer cancel()
	if err := create(ctx, name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already canceled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := dropDatabase(ctx, s.adminURL, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return u
}

// AdminURL returns the URL of an administrative database on the server that holds
// the package's databases, for tests that create databases of their own or
// inspect the server (pg_database, pg_stat_activity). The role may CREATE
// DATABASE. It fails the test if the package's TestMain does not call Main.
func AdminURL(t testing.TB) string {
	t.Helper()
	return mustSuite(t, "AdminURL").adminURL
}

func mustSuite(t testing.TB, caller string) *suite {
	t.Helper()
	if current == nil {
		t.Fatalf("pgtest: %s needs the package's TestMain to call pgtest.Main: add\n\tfunc TestMain(m *testing.M) { pgtest.Main(m) }", caller)
	}
	return current
}

// newSuite creates and migrates the package's template database, then copies it
// into the package database. On failure it drops whatever it created.
func newSuite(ctx context.Context, adminURL, pkg string) (*suite, error) {
	prefix := databasePrefix(pkg)
	s := &suite{
		adminURL: adminURL,
		prefix:   prefix,
		template: prefix + "_template",
		database: prefix,
	}
	var err error
	if s.databaseURL, err = withDatabase(adminURL, s.database); err != nil {
		return nil, err
	}
	if err := s.createTemplate(ctx); err != nil {
		return nil, errors.Join(err, s.drop(ctx))
	}
	if err := s.clone(ctx, s.database); err != nil {
		return nil, errors.Join(err, s.drop(ctx))
	}
	return s, nil
}

// createTemplate creates the template database, migrates it once, and then bars
// connections to it: CREATE DATABASE ... TEMPLATE refuses a source with open
// connections, and a test that wandered into the template would also change
// every database copied from it afterwards.
func (s *suite) createTemplate(ctx context.Context) error {
	name := pgx.Identifier{s.template}.Sanitize()
	// UTF8 whatever the server's default (an initdb without a locale gives
	// SQL_ASCII); the C locale goes with any encoding.
	if err := adminExec(ctx, s.adminURL, "CREATE DATABASE "+name+" "+migrations.CreateDatabaseOptions); err != nil {
		return fmt.Errorf("create template database %s: %w", s.template, err)
	}
	u, err := withDatabase(s.adminURL, s.template)
	if err != nil {
		return err
	}
	if err := migrations.Up(u); err != nil {
		return fmt.Errorf("migrate template database %s: %w", s.template, err)
	}
	if err := adminExec(ctx, s.adminURL, "ALTER DATABASE "+name+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("close template database %s: %w", s.template, err)
	}
	return nil
}

// clone creates database name as a copy of the migrated template.
func (s *suite) clone(ctx context.Context, name string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{s.template}.Sanitize()
	if err := adminExec(ctx, s.adminURL, sql); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// drop drops the package database and the template. Databases NewDatabase
// created are dropped by their tests' cleanups.
func (s *suite) drop(ctx context.Context) error {
	return errors.Join(
		dropDatabase(ctx, s.adminURL, s.database),
		dropDatabase(ctx, s.adminURL, s.template),
	)
}

// dropDatabase drops database name if it exists, ending its open connections.
func dropDatabase(ctx context.Context, adminURL, name string) error {
	sql := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
	if err := adminExec(ctx, adminURL, sql); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// adminExec runs one statement on its own connection to the admin database.
// CREATE and DROP DATABASE cannot share a transaction with anything else.
func adminExec(ctx context.Context, adminURL, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to admin database: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, sql)
	return err
}

// packageName names the test package from its test binary (pgtest.test), or
// failing that from the working directory, which go test sets to the package's.
func packageName() string {
	name := filepath.Base(os.Args[0])
	name = strings.TrimSuffix(strings.TrimSuffix(name, ".exe"), ".test")
	if name == "" || name == "." {
		if wd, err := os.Getwd(); err == nil {
			name = filepath.Base(wd)
		}
	}
	return name
}

// databasePrefix returns payments_test_<pkg>_<random>: lower case, safe as an
// identifier, and short enough that every suffix pgtest adds stays within
// PostgreSQL's 63-byte limit on names, which it would otherwise truncate silently.
func databasePrefix(pkg string) string {
	const maxPkg = 30
	var b strings.Builder
	for _, r := range strings.ToLower(pkg) {
		if b.Len() == maxPkg {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteString("pkg")
	}
	var random [4]byte
	_, _ = rand.Read(random[:]) // crypto/rand.Read never returns an error.
	return "payments_test_" + b.String() + "_" + hex.EncodeToString(random[:])
}
