package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestJanitorLogsAnOutageOnce: while its database refuses every connection,
// the janitor tries again less and less often (ceilings from one interval up
// to four, each wait below its ceiling) and writes one WARN for the outage,
// not one per sweep; when the database is back, one INFO says so, with the
// attempts.
func TestJanitorLogsAnOutageOnce(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	logs := &testkit.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const interval = 20 * time.Millisecond
	j := idempotency.NewJanitor(s, log, 24*time.Hour, interval, 1000, time.Millisecond)
	db := testkit.NewDatabaseSwitch(t, pgtest.AdminURL(t), url)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	lines := func() []testkit.LogLine { return testkit.JSONLog(t, logs.String(), "janitor: delete expired keys") }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s; log:\n%s", what, logs.Tail(3000))
			}
		}
	}
	waitFor("a first sweep", func() bool { return j.CaughtUp().After(time.Time{}) })

	db.Cut()
	atCap := func() bool {
		return len(testkit.Where(lines(), "backoff_ceiling", (4*interval).String())) >= 3
	}
	waitFor("three waits at the cap", atCap)
	db.Restore()
	waitFor("the janitor is back", func() bool { return len(testkit.Where(lines(), "state", "up")) == 1 })

	all := lines()
	attempts := testkit.Where(all, "state", "down", "retrying")
	want := []time.Duration{interval, 2 * interval, 4 * interval}
	var seen []string
	for i, ln := range attempts {
		ceiling, err1 := time.ParseDuration(fmt.Sprint(ln["backoff_ceiling"]))
		wait, err2 := time.ParseDuration(fmt.Sprint(ln["retry_in"]))
		if w := want[min(i, len(want)-1)]; err1 != nil || err2 != nil || ceiling != w || wait > ceiling {
			t.Errorf("attempt %d: ceiling %v, wait %v; want ceiling %v and a wait below it", i+1, ln["backoff_ceiling"], ln["retry_in"], w)
		}
		seen = append(seen, fmt.Sprintf("%v/%v", ln["retry_in"], ln["backoff_ceiling"]))
	}
	t.Logf("%d failed sweeps, wait/ceiling: %s", len(attempts), strings.Join(seen, " "))
	if warns := testkit.Where(testkit.JSONLog(t, logs.String(), ""), "level", "WARN", "ERROR"); len(warns) != 1 || warns[0]["state"] != "down" {
		t.Errorf("%d WARN/ERROR lines for one outage of %d failed sweeps, want one (down): %v", len(warns), len(attempts), warns)
	}
	if up := testkit.Where(all, "state", "up")[0]; up["level"] != "INFO" || up["attempts"] != float64(len(attempts)) {
		t.Errorf("the end of the outage: %v, want INFO with attempts %d", up, len(attempts))
	}
}
