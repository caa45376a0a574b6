package main

import (
	"fmt"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// targetsView: the figures and verdicts of the table "How does the
// service fare against its targets?": each set against the database's
// ceiling or a bound stated in the report.
type targetsView struct {
	FreshCPS, ReplayRPS, FreshRatio, ReplayRatio string
	FreshResult, ReplayResult                    string
	StormResult, StormFigure                     string
	JanitorResult, JanitorFigure, JanitorDetail  string
	LargeResult, LargeFigure, LargeDetail        string
	HeapResult, HeapFigure                       string
}

func (b *bench) targetsView() targetsView {
	fresh, replay := b.lg.Results.Get("fresh"), b.lg.Results.Get("replay")
	v := targetsView{FreshCPS: fresh.Text("charges_per_s"), ReplayRPS: replay.Text("replays_per_s")}
	v.FreshRatio = benchrun.Ratio(v.FreshCPS, b.scen.ref.TPS, 2)
	v.ReplayRatio = benchrun.Ratio(v.ReplayRPS, v.FreshCPS, 2)
	v.FreshResult, v.ReplayResult = benchrun.AtLeast(v.FreshRatio, 0.6), benchrun.AtLeast(v.ReplayRatio, 2)
	v.StormResult, v.StormFigure = b.stormVerdict()
	v.JanitorResult, v.JanitorFigure, v.JanitorDetail = b.janitorVerdict()
	v.LargeResult, v.LargeFigure, v.LargeDetail = b.largeVerdict()
	v.HeapResult, v.HeapFigure = b.heapVerdict()
	return v
}

func (b *bench) stormVerdict() (result, figure string) {
	s := b.scen
	if s.stormSamples == 0 {
		return "not measured", "pg_stat_activity gave no samples during the storm"
	}
	result = "**not met**"
	if s.stormLocksMax == 0 {
		result = "**met**"
	}
	return result, fmt.Sprintf("at most %d connection(s) seen for one key: the one holding it, plus %d waiting on its lock (its advisory lock, or its entry in idempotency_keys) (%d busy in all, mean %.1f); pg_stat_activity sampled every 0.1 s (%d samples), so a short burst can slip between samples",
		s.stormLocksMax+1, s.stormLocksMax, s.stormBusyMax, s.stormBusyMean, s.stormSamples)
}

func (b *bench) janitorVerdict() (result, figure, detail string) {
	j := b.jan
	switch {
	case !j.seeded:
		return "not measured", "seeding the expired keys failed (see above)", ""
	case !j.measured:
		return "not measured", "paymentsbench gave no result (bin/bench-janitor-*.err)", ""
	}
	off, on := b.lg.Results.Get("janitor-off"), b.lg.Results.Get("janitor-on")
	ratio := benchrun.Ratio(on.Text("p99_ms"), off.Text("p99_ms"), 2)
	activePct := 0.0
	if j.windowMs > 0 {
		activePct = 100 * float64(j.activeMs) / float64(j.windowMs)
	}
	if j.deletedDuring <= 0 {
		result = "not measured"
		figure = fmt.Sprintf("the janitor deleted nothing during the measured run (%d before it; %s expired keys left), so this compares nothing", j.deletedBefore, j.expiredAfter)
	} else {
		result = benchrun.AtMost(ratio, 2)
		figure = fmt.Sprintf("%s × (p99 %s ms with the janitor deleting, %s ms without); it deleted %d keys during the %d s run (%s keys/s), and was still deleting for %.0f %% of it",
			ratio, on.Text("p99_ms"), off.Text("p99_ms"), j.deletedDuring, b.s.seconds,
			benchrun.Ratio(fmt.Sprint(j.deletedDuring), fmt.Sprint(float64(j.windowMs)/1000), 0), activePct)
	}
	detail = fmt.Sprintf("Without the janitor: payments_janitor_deleted_keys_total %s at the end, %s expired keys in the table after the run. With it: %d deleted during the service's start and the run's setup (opening 1,000 accounts), %d during the measured %d s (metrics sampled every 0.5 s, so ±0.5 s at either end), deleting for %.0f %% of the run; %s of the %d expired keys were left when the service stopped after the run.",
		orQ(j.offDeleted), j.expiredBefore, j.deletedBefore, j.deletedDuring, b.s.seconds, activePct, j.expiredAfter, b.s.janitorKeys)
	return result, figure, detail
}

func (b *bench) largeVerdict() (result, figure, detail string) {
	l, rs := b.lt, b.lg.Results
	switch {
	case !b.s.large:
		return "not measured", fmt.Sprintf("skipped in this run (BENCH_LARGE=0): it seeds %d keys, about 3 minutes more; `make bench` runs it by default", b.s.largeKeys), ""
	case !l.ok:
		return "not measured", "a run or the seeding failed (see bin/bench-large-*.err and the output above)", ""
	}
	mean := func(names ...string) string {
		var runs []benchrun.Run
		for _, n := range names {
			runs = append(runs, rs.Get(n))
		}
		m, ok := benchrun.Mean(benchrun.Floats(runs, "p50_ms"))
		return benchrun.FixedOr(m, ok, 3)
	}
	empty, full := mean("large-empty-1", "large-empty-2"), mean("large-full-1", "large-full-2")
	ratio := benchrun.Ratio(full, empty, 2)
	figure = fmt.Sprintf("%s × (p50 %s ms with %s keys in the table, %s ms with it empty; each the mean of two %d s runs, the empty ones before and after the full ones)",
		ratio, full, l.rows, empty, b.s.seconds)
	p50 := func(name string) string { return rs.Get(name).Text("p50_ms") }
	detail = fmt.Sprintf(`A second scratch database, its own service. "large-empty-1": fresh on an empty key table (p50 %s ms); then %d keys seeded in %ds (one INSERT … SELECT FROM generate_series per 1,000,000, UUID-shaped keys in random order, ~280-byte bodies, created within the last 22 h so none is expired), VACUUM (ANALYZE) and CHECKPOINT in %ds (autovacuum is %s on this server): %s keys, %s with indexes; "large-full-1" and "-2": fresh again (p50 %s and %s ms); then TRUNCATE idempotency_keys and "large-empty-2" (p50 %s ms), so the empty table is measured on both sides of the full one: the load of a shared machine drifts over the minutes between (see the load column). The step took %ds.`,
		p50("large-empty-1"), b.s.largeKeys, l.seedSeconds, l.vacuumSeconds, orQ(l.autovacuum), l.rows, l.size,
		p50("large-full-1"), p50("large-full-2"), p50("large-empty-2"), l.took)
	return benchrun.AtMost(ratio, 1.3), figure, detail
}

func (b *bench) heapVerdict() (result, figure string) {
	h := b.hp
	if !h.measured {
		return "not measured", "paymentsbench gave no result for the first 10,000 keys (bin/bench-heap-1.err)"
	}
	last := h.last
	// Unsettled, the heap only holds more garbage: the bound still applies.
	result = "**not met**"
	if last.CacheEntries <= 10000 && last.KeysInFlight == 0 {
		result = benchrun.AtMost(benchrun.MiB(last.HeapInuse), heapBoundMiB)
	}
	if h.sent < b.s.heapKeys {
		result += fmt.Sprintf(" (only %d of %d keys in the %ds budget)", h.sent, b.s.heapKeys, b.s.heapBudget)
	}
	settle := fmt.Sprintf("settled %d s after the run", last.Took)
	if !last.OK {
		settle = fmt.Sprintf("**not settled within 90 s** (idle after %d s; -1: never)", last.IdleAfter)
	}
	mid := ""
	if h.midSent > 0 {
		mid = fmt.Sprintf("; after %d: %s MiB in use, %s MiB alloc", h.midSent, benchrun.MiB(h.mid.HeapInuse), benchrun.MiB(h.mid.HeapAlloc))
	}
	figure = fmt.Sprintf("heap in use %s MiB (bound %d MiB), heap alloc %s MiB, %s, after %d distinct keys; cache entries %.0f (≤ 10000), keys in flight %.0f (0 when idle), goroutines %.0f. After the first 10,000 keys: %s MiB in use, %s MiB alloc%s",
		benchrun.MiB(last.HeapInuse), heapBoundMiB, benchrun.MiB(last.HeapAlloc), settle, h.distinct, last.CacheEntries,
		last.KeysInFlight, last.Goroutines, benchrun.MiB(h.first.HeapInuse), benchrun.MiB(h.first.HeapAlloc), mid)
	return result, figure
}

// heapRelayCPS is the mean charges/s of the heap runs after the first.
func (b *bench) heapRelayCPS() string {
	if len(b.hp.runs) < 2 {
		return "0"
	}
	var runs []benchrun.Run
	for _, n := range b.hp.runs[1:] {
		runs = append(runs, b.lg.Results.Get(n))
	}
	m, _ := benchrun.Mean(benchrun.Floats(runs, "charges_per_s"))
	return fmt.Sprintf("%.0f", m)
}
