package benchrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"time"
)

// NATS is a nats-server (JetStream) of the run's own on a random loopback
// port, so benchmarks do not fill the machine's shared one.
type NATS struct {
	URL  string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

var natsListening = regexp.MustCompile(`Listening for client connections on ([0-9.]+:[0-9]+)`)

// ErrNoNATSServer says nats-server is not on PATH: the relay publishes to
// NATS_URL (default nats://127.0.0.1:4222), as it would anyway.
var ErrNoNATSServer = errors.New("nats-server not found: the relay publishes to NATS_URL (default nats://127.0.0.1:4222)")

// StartNATS starts it and sets NATS_URL in this process's environment, so
// every service started after it publishes there.
func StartNATS(ctx context.Context) (*NATS, error) {
	if _, err := exec.LookPath("nats-server"); err != nil {
		return nil, ErrNoNATSServer
	}
	dir, err := os.MkdirTemp("", "bench-nats-")
	if err != nil {
		return nil, err
	}
	n := &NATS{dir: dir, done: make(chan struct{})}
	n.cmd = exec.Command("nats-server", "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", dir, "-l", dir+"/nats.log")
	if err := n.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = n.cmd.Wait(); close(n.done) }()
	for range 100 {
		b, _ := os.ReadFile(dir + "/nats.log")
		if m := natsListening.FindSubmatch(b); m != nil {
			n.URL = "nats://" + string(m[1])
			return n, os.Setenv("NATS_URL", n.URL)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-n.done:
		case <-ctx.Done():
		}
	}
	log := Tail(dir+"/nats.log", 5)
	n.Stop()
	return nil, fmt.Errorf("nats-server did not start: %s", log)
}

// Stop ends the server and removes its directory; nil does nothing.
func (n *NATS) Stop() {
	if n == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.done
	_ = os.RemoveAll(n.dir)
}
