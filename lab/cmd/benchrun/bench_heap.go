package main

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// The heap's bound: an idle service holds ~5 MiB; the replay cache at most
// 10,000 responses of ~300 bytes plus their key, location, fingerprint and
// map/list entries, ~1 KiB each, ~10 MiB; coalescing state is freed per key.
// That is ~16 MiB live, and with GOGC=100 the heap may hold as much garbage
// again before the next collection: ~32 MiB, plus half again for slack.
const heapBoundMiB = 48

// heapFigures: the heap after BENCH_HEAP_KEYS distinct keys.
type heapFigures struct {
	runs           []string
	sent, distinct int
	loadSeconds    float64
	errors         string
	first, mid     benchrun.Settled
	midSent        int
	last           benchrun.Settled
	measured       bool
	took           int
}

// heap restarts the service and sends BENCH_HEAP_KEYS distinct keys
// (fresh, in chunks, within BENCH_HEAP_BUDGET seconds), reading the heap
// from /metrics after the first 10,000 keys, halfway and at the end, each
// time once settled.
func (b *bench) heap(ctx context.Context) error {
	h := &b.hp
	h.errors = "?"
	b.say("heap: a new service, then %d distinct keys (fresh, at most %ds of load)", b.s.heapKeys, b.s.heapBudget)
	began := time.Now()
	defer func() { h.took = int(time.Since(began).Seconds()) }()
	svc, err := b.start(ctx, "", b.scratch, "bin/bench-server-heap.log")
	if err != nil {
		return err
	}
	defer svc.Stop()
	if !b.heapRun(ctx, svc, 10000) {
		return nil
	}
	if h.first, err = benchrun.SettleHeap(ctx, svc.MetricsURL, "bin/bench-heap-1.txt", 90*time.Second); err != nil {
		return err
	}
	b.say("  after the first 10,000 keys: heap in use %s MiB, alloc %s MiB, cache %.0f, in flight %.0f (settled in %ds: %v)",
		benchrun.MiB(h.first.HeapInuse), benchrun.MiB(h.first.HeapAlloc), h.first.CacheEntries, h.first.KeysInFlight, h.first.Took, h.first.OK)
	chunk := (b.s.heapKeys - 10000 + 3) / 4
	budget := time.Duration(b.s.heapBudget) * time.Second
	for h.sent < b.s.heapKeys && time.Since(began) < budget {
		if !b.heapRun(ctx, svc, min(chunk, b.s.heapKeys-h.sent)) {
			break
		}
		// Once halfway, read it too: a slow leak grows at both steps alike.
		if h.midSent == 0 && 2*h.sent >= b.s.heapKeys && h.sent < b.s.heapKeys {
			h.midSent = h.sent
			if h.mid, err = benchrun.SettleHeap(ctx, svc.MetricsURL, "bin/bench-heap-mid.txt", 90*time.Second); err != nil {
				return err
			}
			b.say("  after %d keys: heap in use %s MiB, alloc %s MiB", h.sent, benchrun.MiB(h.mid.HeapInuse), benchrun.MiB(h.mid.HeapAlloc))
		}
	}
	if h.last, err = benchrun.SettleHeap(ctx, svc.MetricsURL, "bin/bench-heap-2.txt", 90*time.Second); err != nil {
		return err
	}
	b.say("  after %d keys: heap in use %s MiB, alloc %s MiB, cache %.0f, in flight %.0f (idle after %ds, settled in %ds: %v)",
		h.sent, benchrun.MiB(h.last.HeapInuse), benchrun.MiB(h.last.HeapAlloc), h.last.CacheEntries, h.last.KeysInFlight,
		h.last.IdleAfter, h.last.Took, h.last.OK)
	h.measured = true
	h.distinct = h.sent + 2000*len(h.runs) // each run also opens and funds 1,000 accounts
	var errs float64
	for _, name := range h.runs {
		run := b.lg.Results.Get(name)
		s, _ := run.Float("seconds")
		e, _ := run.Float("error_count")
		h.loadSeconds, errs = h.loadSeconds+s, errs+e
	}
	h.errors = fmt.Sprintf("%.0f", errs)
	return nil
}

// heapRun sends n more distinct keys; false when paymentsbench gave no result.
func (b *bench) heapRun(ctx context.Context, svc *benchrun.Service, n int) bool {
	tag := fmt.Sprintf("heap-%d", len(b.hp.runs)+1)
	run, err := b.lg.Fresh(ctx, tag, svc.URL, b.merchant.APIKey, b.s.clients, "-n", fmt.Sprint(n))
	if err != nil {
		b.say("%v", err)
		return false
	}
	b.say("  %s", benchrun.Summary(run))
	b.hp.runs = append(b.hp.runs, tag)
	b.hp.sent += n
	return true
}
