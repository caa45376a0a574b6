package main

import (
	"context"
	"iter"
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
