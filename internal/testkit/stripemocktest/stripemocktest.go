// Package stripemocktest runs stripe-mock (github.com/stripe/stripe-mock,
// Stripe's own mock of its API, validating every request against Stripe's
// OpenAPI description) for tests: Start installs it from the Go module proxy
// once per machine, like the project's other tools, runs one on a loopback
// port for the test and stops it when the test ends. Where it cannot be
// installed the test is skipped, saying why, and under CI=true it fails.
package stripemocktest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Version is the stripe-mock Start installs.
const Version = "v0.203.0"

var (
	installOnce sync.Once
	installed   string
	installErr  error
)

// install puts stripe-mock Version into the user's cache directory, once.
func install() (string, error) {
	installOnce.Do(func() {
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		dir = filepath.Join(dir, "payments", "stripe-mock-"+Version)
		bin := filepath.Join(dir, "stripe-mock")
		if _, err := os.Stat(bin); err == nil {
			installed = bin
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "install", "github.com/stripe/stripe-mock@"+Version)
		cmd.Env = append(os.Environ(), "GOBIN="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			installErr = fmt.Errorf("go install github.com/stripe/stripe-mock@%s: %w\n%s", Version, err, out)
			return
		}
		installed = bin
	})
	return installed, installErr
}

// Start runs a stripe-mock for t and returns its base URL
// ("http://127.0.0.1:port"). It stops when t ends.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := install()
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("stripe-mock is required under CI=true: %v", err)
		}
		t.Skipf("stripe-mock could not be installed from the Go module proxy, so the Stripe connector is not checked against Stripe's API here: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-http-addr", "127.0.0.1:", "-https-addr", "127.0.0.1:")
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start stripe-mock: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "Listening for HTTP at address: "); ok && !sent {
				addr <- a
				sent = true
			}
		}
	}()
	select {
	case a := <-addr:
		return "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("stripe-mock did not say where it listens within 30 s")
		return ""
	}
}
