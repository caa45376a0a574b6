package main

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// largeFigures: fresh p50 with BENCH_LARGE_KEYS keys in the table against
// an empty one.
type largeFigures struct {
	ok            bool
	autovacuum    string // SHOW autovacuum on the server
	rows, size    string
	seedSeconds   int
	vacuumSeconds int
	took          int
}

// largeTable: on a second scratch database, fresh on an empty table, then
// BENCH_LARGE_KEYS live keys seeded and fresh twice, then the table
// truncated and fresh on it empty again, so that the empty table is
// measured on both sides of the full one.
func (b *bench) largeTable(ctx context.Context) error {
	if !b.s.large {
		return nil
	}
	l := &b.lt
	name := b.db + "_large"
	b.say("large table: scratch database %s, fresh on an empty key table", name)
	began := time.Now()
	defer func() { l.took = int(time.Since(began).Seconds()); b.dropDB(ctx, name) }()
	database, err := b.createDB(ctx, name)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", name, err)
	}
	merchant, err := benchrun.NewMerchant(ctx, "", database)
	if err != nil {
		return err
	}
	svc, err := b.start(ctx, "", database, "bin/bench-server-large.log")
	if err != nil {
		return err
	}
	defer svc.Stop()
	run := func(tag string) bool {
		r, err := b.lg.Fresh(ctx, tag, svc.URL, merchant.APIKey, b.s.clients, "-d", b.dur())
		if err != nil {
			b.say("%v", err)
			return false
		}
		b.say("  %s", benchrun.Summary(r))
		return true
	}
	l.ok = run("large-empty-1") && b.seedLarge(ctx, database, merchant.ID)
	l.rows, _ = benchrun.Value(ctx, database, "SELECT count(*)::text FROM idempotency_keys")
	l.autovacuum, _ = benchrun.Value(ctx, database, "SHOW autovacuum")
	l.size, _ = benchrun.Value(ctx, database, "SELECT pg_size_pretty(pg_total_relation_size('idempotency_keys'))")
	if l.ok {
		b.say("  %s keys (%s with indexes); fresh again, twice", l.rows, l.size)
		l.ok = run("large-full-1") && run("large-full-2")
	}
	if l.ok {
		b.say("  TRUNCATE idempotency_keys; fresh on the empty table again")
		l.ok = benchrun.Exec(ctx, database, "TRUNCATE idempotency_keys", "CHECKPOINT") == nil && run("large-empty-2")
	}
	return nil
}

// seedLarge seeds the live keys (created within the last 22 h) a million
// at a time, then vacuums and checkpoints.
func (b *bench) seedLarge(ctx context.Context, database, merchant string) bool {
	l, n := &b.lt, b.s.largeKeys
	b.say("  seeding %d live keys (created within the last 22 h) in batches of 1,000,000", n)
	began := time.Now()
	for from := 1; from <= n; from += 1000000 {
		to := min(from+999999, n)
		if err := benchrun.SeedKeys(ctx, database, merchant, "live", from, to,
			fmt.Sprintf("now() - i * (interval '22 hours' / %d)", n)); err != nil {
			b.say("seeding failed: %v", err)
			return false
		}
		b.say("  seeded %d keys, %ds", to, int(time.Since(began).Seconds()))
	}
	l.seedSeconds = int(time.Since(began).Seconds())
	began = time.Now()
	err := benchrun.AfterSeeding(ctx, database)
	l.vacuumSeconds = int(time.Since(began).Seconds())
	return err == nil
}
