package main

import (
	"context"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// splitLines yields the fields of each line of s.
func splitLines(s string) iter.Seq[[]string] {
	return func(yield func([]string) bool) {
		for line := range strings.Lines(s) {
			if !yield(strings.Fields(line)) {
				return
			}
		}
	}
}

// execOutput runs a command and returns its combined output.
func execOutput(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// clockTicks is the kernel's clock ticks per second (getconf CLK_TCK), 100
// when getconf is missing: /proc/PID/stat counts CPU time in them.
func clockTicks() int {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		return 100
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || n <= 0 {
		return 100
	}
	return n
}

// paymentsbench runs bin/paymentsbench with args as the merchant with
// apiKey, given in its environment (never on a command line, where ps
// would show it), its messages to stderr; it returns what it printed on
// stdout, with an error when it failed.
func paymentsbench(ctx context.Context, apiKey string, stderr io.Writer, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "bin/paymentsbench", args...)
	cmd.Env = append(os.Environ(), "PAYMENTS_API_KEY="+apiKey)
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("bin/paymentsbench: %w", err)
	}
	return out, nil
}
