package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/relay"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestRelayBacksOffWhileTheDatabaseIsDown: with its database refusing every
// connection, the relay's waits grow from 250 ms to MaxBackoff (full jitter:
// each below its ceiling) and it writes one WARN for the outage, not one per
// attempt; when the database is back, one INFO says so, with the attempts.
// A success resets the backoff: the next outage starts again from 250 ms.
func TestRelayBacksOffWhileTheDatabaseIsDown(t *testing.T) {
	e := setup(t)
	acct := e.account(1000)
	logs := &testkit.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const maxBackoff = 2 * time.Second
	r, err := relay.New(e.store, e.nats.Connect(), log, relay.Options{Poll: 100 * time.Millisecond, MaxBackoff: maxBackoff})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	e.waitUntil("the first events are published", e.drained)

	db := testkit.NewDatabaseSwitch(t, pgtest.AdminURL(t), e.store.Pool().Config().ConnString())
	db.Cut()
	// Ceilings 250 ms, 500 ms, 1 s, then 2 s: the cap is reached after at
	// most 1.75 s of waits, whatever the jitter draws.
	e.waitUntil("three waits at the cap", func() bool { return countCeiling(relayLines(t, logs.String()), maxBackoff) >= 3 })
	db.Restore()
	e.waitUntil("the relay is back", func() bool { return len(testkit.Where(relayLines(t, logs.String()), "state", "up")) == 1 })

	lines := relayLines(t, logs.String())
	attempts := testkit.Where(lines, "state", "down", "retrying")
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, maxBackoff}
	var waits []string
	for i, ln := range attempts {
		waits = append(waits, fmt.Sprintf("%v/%v", ln["retry_in"], ln["backoff_ceiling"]))
		ceiling, wait := duration(t, ln["backoff_ceiling"]), duration(t, ln["retry_in"])
		if w := want[min(i, len(want)-1)]; ceiling != w || wait < 0 || wait > ceiling {
			t.Errorf("attempt %d: ceiling %v, wait %v; want ceiling %v and a wait below it", i+1, ceiling, wait, w)
		}
	}
	t.Logf("%d attempts while the database was down, wait/ceiling: %s", len(attempts), strings.Join(waits, " "))
	if warns := testkit.Where(lines, "level", "WARN", "ERROR"); len(warns) != 1 || warns[0]["state"] != "down" {
		t.Errorf("%d WARN/ERROR lines for one outage of %d attempts, want one (down): %v", len(warns), len(attempts), warns)
	}
	up := testkit.Where(lines, "state", "up")[0]
	if up["level"] != "INFO" || up["attempts"] != float64(len(attempts)) {
		t.Errorf("the end of the outage: %v, want INFO with attempts %d", up, len(attempts))
	}

	// The relay publishes what commits once the database is back, and its
	// backoff starts over at the next outage.
	e.deposit(acct, 5)
	e.waitUntil("the deposit is published", e.drained)
	second := len(logs.String())
	since := func() []testkit.LogLine { return relayLines(t, logs.String()[second:]) }
	db.Cut()
	e.waitUntil("the next outage is logged", func() bool { return len(testkit.Where(since(), "state", "down")) == 1 })
	db.Restore()
	if first := testkit.Where(since(), "state", "down")[0]; duration(t, first["backoff_ceiling"]) != 250*time.Millisecond {
		t.Errorf("the first wait of the second outage has ceiling %v, want 250ms: the backoff was not reset", first["backoff_ceiling"])
	}
	e.waitUntil("the relay is back again", func() bool { return len(testkit.Where(since(), "state", "up")) == 1 })
}

// relayLines parses the relay's retry lines from a JSON log.
func relayLines(t *testing.T, logs string) []testkit.LogLine {
	t.Helper()
	return testkit.JSONLog(t, logs, "relay: publish events")
}

func countCeiling(lines []testkit.LogLine, ceiling time.Duration) int {
	n := 0
	for _, ln := range lines {
		if s, ok := ln["backoff_ceiling"].(string); ok {
			if d, err := time.ParseDuration(s); err == nil && d == ceiling {
				n++
			}
		}
	}
	return n
}

func duration(t *testing.T, v any) time.Duration {
	t.Helper()
	s, _ := v.(string)
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %v: %v", v, err)
	}
	return d
}
