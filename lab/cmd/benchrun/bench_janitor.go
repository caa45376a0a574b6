package main

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// janitorFigures: fresh p99 while the janitor deletes BENCH_JANITOR_KEYS
// expired keys, against the same without it.
type janitorFigures struct {
	seeded        bool
	seedSeconds   int
	measured      bool
	offDeleted    string
	expiredBefore string
	expiredAfter  string
	// from the samples of the run with the janitor: deleted before the
	// clock started, during the run, and how long it still deleted
	deletedBefore, deletedDuring int64
	activeMs, windowMs           int64
	took                         int
}

const expiredKeys = "SELECT count(*)::text FROM idempotency_keys WHERE created_at < now() - interval '24 hours'"

// janitor seeds the expired keys, runs fresh with a TTL under which they
// are not expired (the janitor finds nothing), then restarts with the
// default TTL so that the janitor deletes them while fresh runs again.
func (b *bench) janitor(ctx context.Context) error {
	j := &b.jan
	n := b.s.janitorKeys
	b.say("janitor: seeding %d expired keys (created 25 h ago) into %s", n, b.db)
	began := time.Now()
	defer func() {
		j.took = int(time.Since(began).Seconds())
		b.dropDB(ctx, b.db) // the large step uses its own database; this one is done
	}()
	if err := benchrun.SeedKeys(ctx, b.scratch, b.merchant.ID, "expired", 1, n,
		fmt.Sprintf("now() - interval '25 hours' - i * (interval '1 hour' / %d)", n)); err != nil {
		b.say("seeding the expired keys failed: %v", err)
		return nil
	}
	if err := benchrun.AfterSeeding(ctx, b.scratch); err != nil {
		b.say("seeding the expired keys failed: %v", err)
		return nil
	}
	j.seeded, j.seedSeconds = true, int(time.Since(began).Seconds())
	b.say("  seeded in %ds; without the janitor (IDEMPOTENCY_TTL=87600h: nothing is expired)", j.seedSeconds)
	_, offOK := b.janitorRun(ctx, "janitor-off", "IDEMPOTENCY_TTL=87600h")
	if samples, err := readColumns("bin/bench-janitor-off-metrics.txt", 10); err == nil && len(samples) > 0 {
		j.offDeleted = fmt.Sprintf("%.0f", samples[len(samples)-1][6])
	}
	j.expiredBefore, _ = benchrun.Value(ctx, b.scratch, expiredKeys)
	b.say("  with the janitor (IDEMPOTENCY_TTL=24h, JANITOR_INTERVAL=1m, JANITOR_BATCH=1000: it sweeps at start)")
	on, onOK := b.janitorRun(ctx, "janitor-on", "IDEMPOTENCY_TTL=24h", "JANITOR_INTERVAL=1m", "JANITOR_BATCH=1000")
	j.expiredAfter, _ = benchrun.Value(ctx, b.scratch, expiredKeys)
	if !offOK || !onOK {
		return nil
	}
	samples, err := readColumns("bin/bench-janitor-on-metrics.txt", 10)
	if err != nil {
		return err
	}
	j.measured = true
	from, _ := on.Float("start_unix_ms")
	to, _ := on.Float("end_unix_ms")
	j.deletedBefore, j.deletedDuring, j.activeMs, j.windowMs = janitorWindow(samples, int64(from), int64(to))
	return nil
}

// janitorRun restarts the service with env and runs fresh while sampling
// its metrics every 0.5 s into bin/bench-TAG-metrics.txt.
func (b *bench) janitorRun(ctx context.Context, tag string, env ...string) (benchrun.Run, bool) {
	svc, err := b.start(ctx, "", b.scratch, "bin/bench-server-"+tag+".log", env...)
	if err != nil {
		b.say("%v", err)
		return benchrun.Run{}, false
	}
	defer svc.Stop()
	sampler, err := benchrun.StartSampler(svc.MetricsURL, "bin/bench-"+tag+"-metrics.txt", 500*time.Millisecond)
	if err != nil {
		b.say("%v", err)
		return benchrun.Run{}, false
	}
	run, err := b.lg.Fresh(ctx, tag, svc.URL, b.merchant.APIKey, b.s.clients, "-d", b.dur())
	sampler.Stop()
	if err != nil {
		b.say("%v", err)
		return benchrun.Run{}, false
	}
	b.say("  %s", benchrun.Summary(run))
	return run, true
}

// janitorWindow reads the janitor's deleted-keys counter (column 7 of the
// samples) around the measured window from..to (unix ms): deleted before
// it, during it, for how long it still rose within it, and the window's
// length.
func janitorWindow(samples [][]float64, from, to int64) (before, during, activeMs, windowMs int64) {
	var after, last, rose int64
	ended := false
	for _, s := range samples {
		at, deleted := int64(s[0]), int64(s[6])
		if at <= from {
			before = deleted
		}
		if at >= to && !ended {
			after, ended = deleted, true
		}
		if deleted > last {
			rose = at
		}
		last = deleted
	}
	if !ended {
		after = last
	}
	active := min(rose, to) - from
	return before, after - before, max(active, 0), to - from
}
