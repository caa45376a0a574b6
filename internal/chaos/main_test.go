package chaos_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

// runTests builds the payments binary, then the card processor simulator
// (procsimtest, which provisions the database), runs the tests, and removes
// the binary afterwards.
func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "payments-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if paymentsBin, err = buildPayments(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return procsimtest.Run(m)
}

// longMode reports whether CHAOS_LONG asks for the long versions of the
// scenarios (make chaos); make test runs the short ones.
func longMode() bool {
	v, _ := strconv.ParseBool(os.Getenv("CHAOS_LONG"))
	return v
}

// scale picks the short or the long value of a scenario's parameter.
func scale[T any](short, long T) T {
	if longMode() {
		return long
	}
	return short
}

// checkLeaks fails t if goroutines started during it are still running when
// it ends. Call it first in a test, so its cleanup runs last: after every
// process, proxy, server and client the test started has been stopped.
// Tests that call it must not run in parallel with others.
func checkLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// summary is the one line a scenario reports: a row of the table in
// docs/reliability.md.
type summary struct {
	scenario   string
	requests   int64 // HTTP requests sent, retries included
	faults     string
	duplicates int // charges beyond one per key
	lost       int // money (minor units) or events missing
	violations int // every other broken invariant
	command    string
}

// log prints the row; grep "chaos-summary:" in go test -v output to collect
// the table.
func (s summary) log(t *testing.T, elapsed time.Duration) {
	t.Helper()
	t.Logf("chaos-summary: | %s | %d | %s | %d | %d | %d | %s | `%s` |",
		s.scenario, s.requests, s.faults, s.duplicates, s.lost, s.violations,
		elapsed.Round(100*time.Millisecond), s.command)
}

// reproduce is the command that runs test alone in the current mode.
func reproduce(test string) string {
	env := ""
	if longMode() {
		env = "CHAOS_LONG=1 "
	}
	return fmt.Sprintf("%sgo test -race -count=1 -v -run '^%s$' ./internal/chaos/", env, test)
}
