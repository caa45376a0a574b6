package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

	db := cutter(t, e)
	db.cut()
	// Ceilings 250 ms, 500 ms, 1 s, then 2 s: the cap is reached after at
	// most 1.75 s of waits, whatever the jitter draws.
	e.waitUntil("three waits at the cap", func() bool { return countCeiling(relayLines(t, logs.String()), maxBackoff) >= 3 })
	db.restore()
	e.waitUntil("the relay is back", func() bool { return len(withState(relayLines(t, logs.String()), "up")) == 1 })

	lines := relayLines(t, logs.String())
	attempts := withState(lines, "down", "retrying")
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
	if warns := withLevel(lines, "WARN", "ERROR"); len(warns) != 1 || warns[0]["state"] != "down" {
		t.Errorf("%d WARN/ERROR lines for one outage of %d attempts, want one (down): %v", len(warns), len(attempts), warns)
	}
	up := withState(lines, "up")[0]
	if up["level"] != "INFO" || up["attempts"] != float64(len(attempts)) {
		t.Errorf("the end of the outage: %v, want INFO with attempts %d", up, len(attempts))
	}

	// The relay publishes what commits once the database is back, and its
	// backoff starts over at the next outage.
	e.deposit(acct, 5)
	e.waitUntil("the deposit is published", e.drained)
	second := len(logs.String())
	since := func() []map[string]any { return relayLines(t, logs.String()[second:]) }
	db.cut()
	e.waitUntil("the next outage is logged", func() bool { return len(withState(since(), "down")) == 1 })
	db.restore()
	if first := withState(since(), "down")[0]; duration(t, first["backoff_ceiling"]) != 250*time.Millisecond {
		t.Errorf("the first wait of the second outage has ceiling %v, want 250ms: the backoff was not reset", first["backoff_ceiling"])
	}
	e.waitUntil("the relay is back again", func() bool { return len(withState(since(), "up")) == 1 })
}

// dbCutter cuts a test's database off: it refuses new connections and ends
// the open ones, as a database that went down would; restore lets them in.
type dbCutter struct {
	t     *testing.T
	admin *pgx.Conn
	name  string
}

func cutter(t *testing.T, e *env) *dbCutter {
	t.Helper()
	var name string
	if err := e.store.Pool().QueryRow(context.Background(), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	c := &dbCutter{t: t, admin: testkit.Connect(t, pgtest.AdminURL(t)), name: name}
	t.Cleanup(c.restore)
	return c
}

func (c *dbCutter) exec(sql string, args ...any) {
	c.t.Helper()
	if _, err := c.admin.Exec(context.Background(), sql, args...); err != nil {
		c.t.Fatal(err)
	}
}

func (c *dbCutter) cut() {
	c.t.Helper()
	c.exec(`ALTER DATABASE ` + pgx.Identifier{c.name}.Sanitize() + ` ALLOW_CONNECTIONS false`)
	c.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, c.name)
}

func (c *dbCutter) restore() {
	c.t.Helper()
	c.exec(`ALTER DATABASE ` + pgx.Identifier{c.name}.Sanitize() + ` ALLOW_CONNECTIONS true`)
}

// relayLines parses the relay's retry lines ("relay: publish events") from a
// JSON log.
func relayLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, s := range strings.Split(logs, "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		if m["msg"] == "relay: publish events" {
			out = append(out, m)
		}
	}
	return out
}

func withState(lines []map[string]any, states ...string) []map[string]any {
	var out []map[string]any
	for _, ln := range lines {
		for _, s := range states {
			if ln["state"] == s {
				out = append(out, ln)
			}
		}
	}
	return out
}

func withLevel(lines []map[string]any, levels ...string) []map[string]any {
	var out []map[string]any
	for _, ln := range lines {
		for _, l := range levels {
			if ln["level"] == l {
				out = append(out, ln)
			}
		}
	}
	return out
}

func countCeiling(lines []map[string]any, ceiling time.Duration) int {
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
