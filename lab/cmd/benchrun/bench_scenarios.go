package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// scenarioFigures: the four scenarios (fresh, replay, storm, mixed) and the
// database's ceiling beside them.
type scenarioFigures struct {
	ref  benchrun.RefRun
	runs map[string]benchrun.Run
	// the storm's pg_stat_activity samples within its measured window
	stormBusyMax, stormLocksMax, stormSamples int
	stormBusyMean                             float64
}

// scenarios: pg-reference at the run's concurrency, then fresh, replay,
// storm and mixed, each verifying the balances through the API.
func (b *bench) scenarios(ctx context.Context) error {
	svc, err := b.start(ctx, "", b.scratch, "bin/bench-server.log")
	if err != nil {
		return err
	}
	defer svc.Stop()
	b.say("service ready at %s (log: bin/bench-server.log)", svc.URL)
	b.say("pg-reference -c %d -T %d", b.s.clients, b.s.seconds)
	if b.scen.ref, err = b.ref.Run(ctx, "reference", b.s.clients, b.s.admin); err != nil {
		return err
	}
	b.say("reference_tps=%s", b.scen.ref.TPS)
	b.scen.runs = map[string]benchrun.Run{}
	for _, scenario := range []string{"fresh", "replay", "storm", "mixed"} {
		b.say("scenario %s: %d clients, %ds", scenario, b.s.clients, b.s.seconds)
		var watch *benchrun.Watch
		if scenario == "storm" {
			if watch, err = b.watchStorm(ctx); err != nil {
				return err
			}
		}
		run, err := b.lg.Run(ctx, scenario, scenario, svc.URL, b.merchant.APIKey, b.s.clients, "-d", b.dur())
		watch.Stop()
		if err != nil {
			return fmt.Errorf("paymentsbench failed in scenario %s before measuring: %w", scenario, err)
		}
		b.scen.runs[scenario] = run
	}
	return b.readStorm()
}

// dur is BENCH_SECONDS as a paymentsbench -d value.
func (b *bench) dur() string { return strconv.Itoa(b.s.seconds) + "s" }

// watchStorm samples the scratch database's sessions every 0.1 s during
// the storm, when every client sends the same key. A connection used for
// that key while another holds it waits on the key's advisory lock (group
// commit) or on its entry in idempotency_keys, so the connections used for
// one key are those waiters plus the holder. Each sample is "unix_ms
// busy_connections key_lock_waiters".
func (b *bench) watchStorm(ctx context.Context) (*benchrun.Watch, error) {
	return benchrun.StartWatch(ctx, b.s.admin, `SELECT count(*) FILTER (WHERE state <> 'idle'),
  count(*) FILTER (WHERE wait_event_type = 'Lock' AND (wait_event = 'advisory' OR query LIKE '%idempotency_keys%'))
FROM pg_stat_activity WHERE datname = '`+b.db+`'`, "bin/bench-storm-activity.txt", 100*time.Millisecond)
}

// readStorm keeps the samples within the storm's measured window.
func (b *bench) readStorm() error {
	storm := b.scen.runs["storm"]
	from, _ := storm.Float("start_unix_ms")
	to, _ := storm.Float("end_unix_ms")
	samples, err := readColumns("bin/bench-storm-activity.txt", 3)
	if err != nil {
		return err
	}
	var sum float64
	for _, s := range samples {
		if s[0] < from || s[0] > to {
			continue
		}
		b.scen.stormSamples++
		sum += s[1]
		b.scen.stormBusyMax = max(b.scen.stormBusyMax, int(s[1]))
		b.scen.stormLocksMax = max(b.scen.stormLocksMax, int(s[2]))
	}
	if b.scen.stormSamples > 0 {
		b.scen.stormBusyMean = sum / float64(b.scen.stormSamples)
	}
	return nil
}

// readColumns reads the lines of whole numbers with n columns from a file.
func readColumns(path string, n int) ([][]float64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows [][]float64
	for line := range splitLines(string(data)) {
		var row []float64
		for _, f := range line {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil {
				break
			}
			row = append(row, v)
		}
		if len(row) == n {
			rows = append(rows, row)
		}
	}
	return rows, nil
}
