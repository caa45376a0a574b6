package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/retry"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestNATSOutageLoggedOnce: while NATS is down the connection retries with
// its backoff (ceilings doubling to the cap, each wait below its ceiling) and
// logs one WARN for the outage, not one per attempt; when NATS is back one
// INFO says so; closing the connection logs no outage.
func TestNATSOutageLoggedOnce(t *testing.T) {
	t.Parallel()
	n := testkit.StartNATS(t)
	logs := &testkit.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	policy := retry.Policy{First: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	nc, err := connectNATSWith(n.URL(), log, policy)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	lines := func() []testkit.LogLine { return testkit.JSONLog(t, logs.String(), "NATS: connection") }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s; log:\n%s", what, logs.Tail(3000))
			}
		}
	}
	waitFor("connected", nc.IsConnected)

	n.Stop()
	waitFor("three waits at the cap", func() bool {
		return len(testkit.Where(lines(), "backoff_ceiling", policy.Max.String())) >= 3
	})
	n.Start()
	waitFor("reconnected", func() bool { return len(testkit.Where(lines(), "state", "up")) == 1 })
	nc.Close()

	all := lines()
	waits := testkit.Where(all, "state", "retrying")
	for i, ln := range waits {
		want := policy.Ceiling(i + 1)
		wait, err := time.ParseDuration(ln["retry_in"].(string))
		if ln["backoff_ceiling"] != want.String() || err != nil || wait > want {
			t.Errorf("wait %d: %v below %v, want below %v", i+1, ln["retry_in"], ln["backoff_ceiling"], want)
		}
	}
	warns := testkit.Where(testkit.JSONLog(t, logs.String(), ""), "level", "WARN", "ERROR")
	if len(warns) != 1 || warns[0]["state"] != "down" {
		t.Errorf("%d WARN/ERROR lines for one outage of %d waits (and a close), want one (down): %v", len(warns), len(waits), warns)
	}
	if ups := testkit.Where(all, "state", "up"); len(ups) != 1 || ups[0]["level"] != "INFO" {
		t.Errorf("back up: %v, want one INFO line", ups)
	}
}
