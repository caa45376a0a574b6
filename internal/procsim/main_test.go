package procsim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/procsim"
)

// procsimBin is the simulator's binary, built once by TestMain: every test
// runs it as a process of its own.
var procsimBin string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "procsim-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	procsimBin = filepath.Join(dir, "procsim")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", procsimBin, "github.com/exactlyonce/payments/cmd/procsim")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/procsim: %v\n%s", err, out)
		return 1
	}
	// pgtest picks the server (and migrates a payments database the tests
	// do not use); each simulator gets an empty database of its own on it.
	return pgtest.Run(m)
}

var dbSeq atomic.Int64

// newDatabase creates an empty database for one simulator and drops it when
// the test ends.
func newDatabase(t *testing.T) string {
	t.Helper()
	admin := pgtest.AdminURL(t)
	name := fmt.Sprintf("procsim_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	exec := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if err := exec("DROP DATABASE " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// sim is one simulator process over its own database; restartable.
type sim struct {
	t           *testing.T
	databaseURL string
	flags       []string
	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{}
	addr        string
	logs        *bytes.Buffer
}

// fastFlags keep every delay of the test payment methods short.
var fastFlags = []string{"-late-delay", "2s", "-slow-delay", "300ms", "-async-delay", "200ms"}

// startSim starts a simulator with flags on a fresh database; it is killed
// when the test ends.
func startSim(t *testing.T, flags ...string) *sim {
	t.Helper()
	s := &sim{t: t, databaseURL: newDatabase(t), flags: append(append([]string{}, fastFlags...), flags...)}
	s.start()
	t.Cleanup(s.kill) // before the database is dropped: cleanups run last first
	return s
}

func (s *sim) start() {
	s.t.Helper()
	args := append([]string{"serve", "-addr", "127.0.0.1:0"}, s.flags...)
	cmd := exec.Command(procsimBin, args...)
	cmd.Env = append(os.Environ(), "PROCSIM_DATABASE_URL="+s.databaseURL)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logs := &bytes.Buffer{}
	cmd.Stderr = &lockedWriter{w: logs}
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

// kill sends SIGKILL and waits for the process to be gone.
func (s *sim) kill() {
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

func (s *sim) url(path string) string { return "http://" + s.addr + path }

// lockedWriter lets the process's stderr be copied while a test reads it.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// reply is one answer, read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// client opens a connection per request, so a dropped answer is seen as one
// (Go's transport resends a keyed request on a reused connection by itself).
func client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}

func (s *sim) do(c *http.Client, method, path, key string, body any) (reply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.url(path), rd)
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// must is do for a request that has to be answered.
func (s *sim) must(method, path, key string, body any) reply {
	s.t.Helper()
	r, err := s.do(client(10*time.Second), method, path, key, body)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (s *sim) authorize(key string, req procsim.AuthorizeRequest) reply {
	s.t.Helper()
	return s.must(http.MethodPost, "/v1/authorizations", key, req)
}

// audit returns what the simulator did under ref (zero counts if nothing).
func (s *sim) audit(ref string) procsim.AuditReference {
	s.t.Helper()
	r := s.must(http.MethodGet, "/v1/audit?reference="+url.QueryEscape(ref), "", nil)
	var a procsim.Audit
	if err := json.Unmarshal(r.body, &a); err != nil {
		s.t.Fatalf("audit: %v: %s", err, r.body)
	}
	if len(a.References) == 0 {
		return procsim.AuditReference{Reference: ref}
	}
	return a.References[0]
}

// eventually polls cond every 50 ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func decode[T any](t *testing.T, r reply) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %d %s: %v", r.status, r.body, err)
	}
	return v
}

func auth(ref, method string, amount int64) procsim.AuthorizeRequest {
	return procsim.AuthorizeRequest{Amount: amount, Currency: "EUR", PaymentMethod: method, Reference: ref}
}
