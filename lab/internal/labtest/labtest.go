// Package labtest gives the lab's tests what they need of the machine, the
// real thing each time: a scratch PostgreSQL database (NewDatabase), the
// service's binary built from this checkout (Payments), which migrates it
// as the benchmarks do, and the card processor simulator's (Procsim). The server is PAYMENTS_TEST_DATABASE_URL if set,
// else trust-auth PostgreSQL on 127.0.0.1:5432, as for the service's own
// tests (internal/pgtest) without their containers. A test that needs a
// server and finds none fails; it never skips. Only tests import it, and a
// package that uses it calls Main from its TestMain.
package labtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	envDatabaseURL = "PAYMENTS_TEST_DATABASE_URL"
	localURL       = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	adminTimeout   = 30 * time.Second
)

// binDir holds what Payments builds; Main creates and removes it.
var binDir string

// builds are the commands of the service's module built so far, by
// package (./cmd/payments, ./cmd/procsim).
var builds sync.Map // string → *build

// build is one command's, built once per test binary.
type build struct {
	once sync.Once
	path string
	err  error
}

// Main runs the package's tests with a directory for the service's binary,
// which it removes afterwards, and exits with their code. It prints one
// line naming the PostgreSQL server the tests are given.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "labtest-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "labtest: %v\n", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binDir = dir
	fmt.Printf("labtest: PostgreSQL at %s (%s)\n", hostOf(AdminURL()), source())
	return m.Run()
}

// AdminURL is the URL of the server's administrative database, where the
// tests may CREATE DATABASE: PAYMENTS_TEST_DATABASE_URL, else the local
// server.
func AdminURL() string {
	if u := os.Getenv(envDatabaseURL); u != "" {
		return u
	}
	return localURL
}

func source() string {
	if os.Getenv(envDatabaseURL) != "" {
		return envDatabaseURL
	}
	return "local server; " + envDatabaseURL + " not set"
}

// NewDatabase creates an empty database for the calling test (template0,
// UTF8, the C locale, as the benchmarks create theirs) and returns its URL;
// the test's cleanup drops it. It fails the test when the server does not
// answer or refuses.
func NewDatabase(t testing.TB) string {
	t.Helper()
	var random [4]byte
	_, _ = rand.Read(random[:]) // crypto/rand.Read never returns an error.
	name := "payments_test_lab_" + hex.EncodeToString(random[:])
	admin := AdminURL()
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
	if err := adminExec(admin, create); err != nil {
		t.Fatalf("labtest: no database on PostgreSQL at %s (%s): %v\n"+
			"Set %s to a server where the tests may CREATE DATABASE, or start PostgreSQL on 127.0.0.1:5432 (trust auth, user postgres)",
			hostOf(admin), source(), err, envDatabaseURL)
	}
	t.Cleanup(func() {
		if err := adminExec(admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("labtest: drop %s: %v", name, err)
		}
	})
	return withDatabase(admin, name)
}

// Payments returns the path of `payments` built from this checkout's
// cmd/payments, once per test binary. It fails the test when the build does.
func Payments(t testing.TB) string {
	t.Helper()
	return command(t, "payments")
}

// Procsim returns the path of `procsim`, the card processor simulator,
// built from this checkout's cmd/procsim, once per test binary. It fails
// the test when the build does.
func Procsim(t testing.TB) string {
	t.Helper()
	return command(t, "procsim")
}

// command builds the repository's ./cmd/NAME into binDir, once.
func command(t testing.TB, name string) string {
	t.Helper()
	if binDir == "" {
		t.Fatal("labtest: Payments and Procsim need the package's TestMain to call labtest.Main")
	}
	v, _ := builds.LoadOrStore(name, &build{})
	b := v.(*build)
	b.once.Do(func() { b.path, b.err = buildCommand(name) })
	if b.err != nil {
		t.Fatalf("labtest: %v", b.err)
	}
	return b.path
}

// buildCommand builds ./cmd/NAME of the repository that holds the lab
// module (its parent directory) into binDir.
func buildCommand(name string) (string, error) {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("%s env GOMOD: %w", goBin, err)
	}
	root := filepath.Dir(filepath.Dir(strings.TrimSpace(string(gomod))))
	out := filepath.Join(binDir, name)
	cmd := exec.Command(goBin, "-C", root, "build", "-o", out, "./cmd/"+name)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s/cmd/%s: %w: %s", root, name, err, msg)
	}
	return out, nil
}

// adminExec runs one statement on a connection of its own: CREATE and DROP
// DATABASE refuse to run in a transaction.
func adminExec(admin, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase is admin with its database replaced by name.
func withDatabase(admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil {
		return admin
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// hostOf is where admin points, without user or password.
func hostOf(admin string) string {
	u, err := url.Parse(admin)
	if err != nil || u.Host == "" {
		return "(a database URL)"
	}
	return u.Host
}
