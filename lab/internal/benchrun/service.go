package benchrun

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Service is one `payments serve` started by Start.
type Service struct {
	URL        string // http://127.0.0.1:PORT
	MetricsURL string // its /metrics listener, the API's for a build without METRICS_ADDR
	PID        int
	Log        string
	cmd        *exec.Cmd
	done       chan struct{}
}

// Start runs `bin serve` (bin/payments when bin is empty) on database, on a
// loopback port the kernel picks and its metrics on another, logging to
// logPath, with env on top of the defaults and of this process's
// environment, and waits until GET /readyz answers 200.
func Start(ctx context.Context, bin, database, logPath string, env ...string) (*Service, error) {
	if bin == "" {
		bin = "bin/payments"
	}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "serve")
	// No load balancer waits for the drain: SHUTDOWN_DELAY=0 lets Stop
	// return as soon as the requests in flight are answered.
	// The benchmarks load one merchant at the service's ceiling, which its
	// budget (RATE_LIMIT_WRITES, 1,000 a second by default) would cap:
	// they measure the charge path, so the budgets are off unless env sets
	// them (make bench-isolation measures them). A build before the
	// budgets ignores the variables.
	cmd.Env = append(os.Environ(), "DATABASE_URL="+database, "HTTP_ADDR=127.0.0.1:0",
		"METRICS_ADDR=127.0.0.1:0", "METRICS_SAMPLE=1s", "SHUTDOWN_DELAY=0", "LOG_LEVEL="+Getenv("BENCH_LOG_LEVEL", "info"),
		"RATE_LIMIT_READS=0", "RATE_LIMIT_WRITES=0")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", bin, err)
	}
	s := &Service{PID: cmd.Process.Pid, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.await(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// await waits for the "listening" lines in the log, then for /readyz.
func (s *Service) await(ctx context.Context) error {
	var api, metrics string
	for i := 0; i < 100 && api == ""; i++ {
		api, metrics = listening(s.Log)
		if api == "" && !s.sleep(ctx, 100*time.Millisecond) {
			break
		}
	}
	if api == "" {
		return fmt.Errorf("payments serve did not start listening; the end of %s:\n%s", s.Log, Tail(s.Log, 20))
	}
	s.URL = "http://" + api
	s.MetricsURL = "http://" + api
	if metrics != "" {
		s.MetricsURL = "http://" + metrics
	}
	for range 100 {
		if s.Ready(ctx) {
			return nil
		}
		if !s.sleep(ctx, 100*time.Millisecond) {
			break
		}
	}
	return fmt.Errorf("%s/readyz did not answer 200 within 10s; see %s", s.URL, s.Log)
}

// sleep waits d, false when the service exited or ctx ended first.
func (s *Service) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-s.done:
		return false
	case <-ctx.Done():
		return false
	}
}

// listening reads the addresses of the "listening" and "metrics listening"
// lines of the service's JSON log.
func listening(path string) (api, metrics string) {
	f, err := os.Open(path)
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch {
		case line.Msg == "listening" && api == "":
			api = line.Addr
		case line.Msg == "metrics listening" && metrics == "":
			metrics = line.Addr
		}
	}
	return api, metrics
}

// Ready reports whether GET /readyz answers 200.
func (s *Service) Ready(ctx context.Context) bool { return answersOK(ctx, s.URL+"/readyz") }

// answersOK reports whether a GET of url answers 200 within 2 s.
func answersOK(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Stop sends SIGTERM and waits for the drain to finish. It may be called
// more than once, and on nil.
func (s *Service) Stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
}

// Merchant is what `payments merchants create` prints.
type Merchant struct {
	APIKey string `json:"api_key"`
	ID     string `json:"merchant_id"`
}

// NewMerchant migrates database with bin's migrations (bin/payments when
// bin is empty) and creates a merchant named bench.
func NewMerchant(ctx context.Context, bin, database string) (Merchant, error) {
	if bin == "" {
		bin = "bin/payments"
	}
	env := append(os.Environ(), "DATABASE_URL="+database)
	migrate := exec.CommandContext(ctx, bin, "migrate", "up")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return Merchant{}, fmt.Errorf("%s migrate up: %w: %s", bin, err, strings.TrimSpace(string(out)))
	}
	create := exec.CommandContext(ctx, bin, "merchants", "create", "--name", "bench")
	create.Env = env
	out, err := create.Output()
	if err != nil {
		return Merchant{}, fmt.Errorf("%s merchants create: %w", bin, err)
	}
	var m Merchant
	if json.Unmarshal(out, &m) != nil || m.APIKey == "" || m.ID == "" {
		return Merchant{}, fmt.Errorf("no api_key or merchant_id in the output of 'payments merchants create' (%d bytes)", len(out))
	}
	return m, nil
}

// Tail is the last n lines of the file at path, for error messages.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.Join(lastLines(string(b), n), "\n")
}
