package benchrun

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"time"
)

// Simulator is one `procsim serve` (the card processor simulator, built
// from ./cmd/procsim) started by StartSimulator.
type Simulator struct {
	URL  string // http://127.0.0.1:PORT
	PID  int
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

var simulatorListening = regexp.MustCompile(`procsim: listening on ([0-9.]+:[0-9]+)`)

// StartSimulator runs `bin serve` on database (the simulator's own), on a
// loopback port the kernel picks, with args added to its flags
// (-slow-delay 50ms), logging to logPath, and waits until GET /healthz
// answers 200. It fails when it exits or is not healthy within 10 s.
func StartSimulator(ctx context.Context, bin, database, logPath string, args ...string) (*Simulator, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, append([]string{"serve", "-addr", "127.0.0.1:0", "-database-url", database}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", bin, err)
	}
	s := &Simulator{PID: cmd.Process.Pid, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.await(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// await waits for the "listening" line in the log, then for /healthz.
func (s *Simulator) await(ctx context.Context) error {
	for range 100 {
		if s.URL == "" {
			b, _ := os.ReadFile(s.Log)
			if m := simulatorListening.FindSubmatch(b); m != nil {
				s.URL = "http://" + string(m[1])
			}
		}
		if s.URL != "" && s.healthy(ctx) {
			return nil
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-s.done:
			return fmt.Errorf("procsim serve exited; the end of %s:\n%s", s.Log, Tail(s.Log, 20))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("procsim serve was not healthy within 10s; the end of %s:\n%s", s.Log, Tail(s.Log, 20))
}

// healthy reports whether GET /healthz answers 200.
func (s *Simulator) healthy(ctx context.Context) bool { return answersOK(ctx, s.URL+"/healthz") }

// Stop sends SIGTERM and waits for the simulator to exit. It may be called
// more than once, and on nil.
func (s *Simulator) Stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
}
