// Package procsimtest runs the card processor simulator (cmd/procsim) for
// tests, as a real process on a PostgreSQL database of its own: Main builds
// the binary once per test package, Start runs one simulator per test and
// stops it, and drops its database, when the test ends.
package procsimtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/procsim"
)

// bin is the simulator's binary, built by Main before any test runs.
var bin string

// Main builds cmd/procsim, then runs the package's tests with pgtest (which
// picks the PostgreSQL server), and exits with their code. Call it from
// TestMain.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit: it returns the tests' code, so a TestMain
// that prepares more (another binary) can clean up after them.
func Run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "procsim-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "procsim")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/exactlyonce/payments/cmd/procsim")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/procsim: %v\n%s", err, out)
		return 1
	}
	return pgtest.Run(m)
}

// Bin returns the path of the binary Main built.
func Bin(t testing.TB) string {
	t.Helper()
	if bin == "" {
		t.Fatal("procsimtest: the binary was not built: call procsimtest.Main from TestMain")
	}
	return bin
}

// FastFlags keep the delays a test waits for short; Start puts them before
// its caller's flags, which may override them. The late delay stays long: a
// test gives up on a late answer (a client timeout), it never waits for one.
var FastFlags = []string{"-late-delay", "10s", "-slow-delay", "300ms", "-async-delay", "200ms"}

// Sim is one simulator process over its own database; it can be killed and
// started again on that database.
type Sim struct {
	t           testing.TB
	DatabaseURL string
	flags       []string
	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{}
	addr        string
	logs        *lockedBuffer
}

// Start runs a simulator with FastFlags and flags on a fresh, empty database.
// It is killed, and the database dropped, when the test ends.
func Start(t testing.TB, flags ...string) *Sim {
	t.Helper()
	s := &Sim{t: t, DatabaseURL: pgtest.NewEmptyDatabase(t), flags: append(append([]string{}, FastFlags...), flags...)}
	s.Restart()
	t.Cleanup(s.Kill) // runs before the database's drop: cleanups run last first
	return s
}

// URL returns the base URL of the running process (its port changes on a
// restart).
func (s *Sim) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "http://" + s.addr
}

// Logs returns what the process wrote to stderr.
func (s *Sim) Logs() string { return s.logs.String() }

// Restart starts the process if it is not running, and waits until it
// listens. It fails the test if the process does not start.
func (s *Sim) Restart() {
	s.t.Helper()
	args := append([]string{"serve", "-addr", "127.0.0.1:0"}, s.flags...)
	cmd := exec.Command(Bin(s.t), args...)
	cmd.Env = append(os.Environ(), "PROCSIM_DATABASE_URL="+s.DatabaseURL)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logs := &lockedBuffer{}
	cmd.Stderr = logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start procsim: %v", err)
	}
	exited := make(chan struct{})
	lines := bufio.NewScanner(out)
	addr := ""
	if lines.Scan() {
		addr, _ = strings.CutPrefix(lines.Text(), "procsim: listening on ")
	}
	go func() { _, _ = io.Copy(io.Discard, out); _ = cmd.Wait(); close(exited) }()
	if addr == "" {
		<-exited
		s.t.Fatalf("procsim did not start: %s", logs)
	}
	s.mu.Lock()
	s.cmd, s.exited, s.addr, s.logs = cmd, exited, addr, logs
	s.mu.Unlock()
}

// Kill sends SIGKILL and waits for the process to be gone; it does nothing
// if the process is not running.
func (s *Sim) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// lockedBuffer lets the process's stderr be copied while a test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Audit reads the simulator's audit (GET /v1/audit) of every reference.
func (s *Sim) Audit(t testing.TB) procsim.Audit {
	t.Helper()
	resp, err := http.Get(s.URL() + "/v1/audit")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a procsim.Audit
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("the simulator's audit: %v", err)
	}
	return a
}
