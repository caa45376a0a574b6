package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/testkit"
)

// paymentsBin is the payments binary the tests run, built once by TestMain before
// any test starts, so that no test's time bound pays for the build.
var paymentsBin string

// buildTimeout bounds go build: on two cores, with every other test package
// compiling under -race beside it, a cold build takes a minute.
const buildTimeout = 5 * time.Minute

// buildPayments builds cmd/payments into dir and returns the binary's path.
func buildPayments(dir string) (string, error) {
	path := filepath.Join(dir, "payments")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", path, "github.com/exactlyonce/payments/cmd/payments")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/payments: %w\n%s", err, out)
	}
	return path, nil
}

// buildBinary returns the path of the payments binary TestMain built.
func buildBinary(t *testing.T) string {
	t.Helper()
	if paymentsBin == "" {
		t.Fatal("the payments binary was not built: TestMain must run first")
	}
	return paymentsBin
}

// payments runs a short command of the binary (migrate, merchants) and
// returns its standard output.
func payments(t *testing.T, bin string, env []string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("payments %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.Bytes()
}

// merchant is a merchant registered with the binary's merchants create.
type merchant struct {
	ID     string `json:"merchant_id"`
	APIKey string `json:"api_key"`
}

// migrateAndRegister migrates databaseURL with the binary (a no-op on a
// database pgtest already migrated, but the binary's own path) and registers
// a merchant for each name.
func migrateAndRegister(t *testing.T, bin, databaseURL string, names ...string) []merchant {
	t.Helper()
	env := []string{"DATABASE_URL=" + databaseURL}
	payments(t, bin, env, "migrate", "up")
	var ms []merchant
	for _, name := range names {
		var m merchant
		out := payments(t, bin, env, "merchants", "create", "--name", name)
		if err := json.Unmarshal(out, &m); err != nil || m.APIKey == "" {
			t.Fatalf("merchants create printed %q (%v)", out, err)
		}
		ms = append(ms, m)
	}
	return ms
}

// freeAddr returns a 127.0.0.1 address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// service is one "payments serve" process that a test can kill and restart
// on the same address. Everything it writes to stderr, over all its runs, is
// kept in logs.
type service struct {
	t    *testing.T
	bin  string
	env  []string
	addr string
	logs *testkit.LogBuffer

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	starts  int
	crashes int // runs that ended by SIGKILL
}

// serviceConfig is the environment of a service beyond its address.
type serviceConfig struct {
	databaseURL string
	natsURL     string // "" runs without the relay
	extra       []string
}

// newService starts "payments serve" and waits until it answers; the test's
// cleanup kills it.
func newService(t *testing.T, bin string, cfg serviceConfig) *service {
	t.Helper()
	s := &service{t: t, bin: bin, addr: freeAddr(t), logs: &testkit.LogBuffer{}}
	s.env = []string{
		"DATABASE_URL=" + cfg.databaseURL,
		"HTTP_ADDR=" + s.addr,
		"METRICS_ADDR=127.0.0.1:0", // replicas side by side
		"DB_MAX_CONNS=8",
		"IDEMPOTENCY_WAIT=2s",
		"SHUTDOWN_TIMEOUT=2s",
		"SHUTDOWN_DELAY=0", // no load balancer to wait for; TestDrain sets its own
		"LOG_LEVEL=info",
	}
	if cfg.natsURL != "" {
		s.env = append(s.env, "RELAY_ENABLED=true", "NATS_URL="+cfg.natsURL, "RELAY_POLL=100ms")
	} else {
		s.env = append(s.env, "RELAY_ENABLED=false")
	}
	s.env = append(s.env, cfg.extra...)
	t.Cleanup(s.kill)
	must(t, s.start(), "payments serve")
	return s
}

// url is the service's base URL; it stays the same across restarts.
func (s *service) url() string { return "http://" + s.addr }

// start runs the process and waits up to 20 s for /healthz to answer. It
// returns an error rather than failing the test, so a goroutine may call it.
func (s *service) start() error {
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return errors.New("service already running")
	}
	cmd := exec.Command(s.bin, "serve")
	cmd.Env = s.env
	cmd.Stdout = s.logs
	cmd.Stderr = s.logs
	cmd.WaitDelay = 5 * time.Second
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("start payments serve: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	s.starts++
	s.mu.Unlock()

	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: time.Second, Transport: tr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get(s.url() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("payments serve exited at start; logs:\n%s", s.logs.Tail(4000))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("payments serve did not answer on %s within 20 s; logs:\n%s", s.addr, s.logs.Tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// take hands the running process over to the caller, who ends it; nil when
// the service is not running.
func (s *service) take() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.exited = nil, nil
	return cmd, exited
}

// kill sends SIGKILL and waits for the process to be gone. It does nothing if
// the service is not running.
func (s *service) kill() {
	cmd, exited := s.take()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	s.mu.Lock()
	s.crashes++
	s.mu.Unlock()
}

// stop ends the service with SIGTERM, as an orchestrator would, waiting up to
// 10 s before it kills it.
func (s *service) stop() {
	cmd, exited := s.take()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		s.t.Errorf("payments serve did not stop within 10 s of SIGTERM")
	}
}

// pid is the process id of the running service, 0 when it is not running.
func (s *service) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// restart kills the service and starts it again.
func (s *service) restart() error {
	s.kill()
	return s.start()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// must fails the test on err.
func must(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
