package main

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// stats are the answers of one run.
type stats struct {
	start    time.Time // when the clock started
	elapsed  time.Duration
	latency  histogram
	statuses map[int]int64 // by HTTP status; statusNoAnswer for transport errors
	charges  int64         // 201 without Idempotent-Replayed: a charge made now
	replays  int64         // answers with Idempotent-Replayed: true
}

// statusNoAnswer counts requests that got no HTTP answer (timeout, reset).
const statusNoAnswer = 0

// merge adds the counts of o to s.
func (s *stats) merge(o *stats) {
	s.latency.merge(&o.latency)
	for code, n := range o.statuses {
		s.statuses[code] += n
	}
	s.charges += o.charges
	s.replays += o.replays
}

// requests returns how many requests the run sent.
func (s *stats) requests() int64 { return int64(s.latency.n) }

// drive sends load's requests from cfg.clients concurrent clients until
// cfg.requests have been sent or cfg.duration has passed, recording every
// answer in led. Requests in flight when the time is up finish and count; the
// elapsed time includes them.
func drive(ctx context.Context, cl *client, load workload, cfg config, led *ledger) *stats {
	var (
		sent   atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		total  = &stats{statuses: map[int]int64{}}
		start  = time.Now()
		finish = start.Add(cfg.duration)
	)
	for range cfg.clients {
		wg.Go(func() {
			own := &stats{statuses: map[int]int64{}}
			for ctx.Err() == nil {
				n := sent.Add(1) - 1
				began := time.Now()
				if (cfg.requests > 0 && n >= cfg.requests) || (cfg.requests == 0 && !began.Before(finish)) {
					break
				}
				req := load.next(n, began.Sub(start))
				a, err := cl.charge(ctx, req)
				own.latency.record(time.Since(began))
				led.record(req, a) // with no answer, settle resends it
				if err != nil {
					own.statuses[statusNoAnswer]++
					continue
				}
				own.statuses[a.status]++
				switch {
				case a.replayed:
					own.replays++
				case a.status == http.StatusCreated:
					own.charges++
				}
			}
			mu.Lock()
			total.merge(own)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.start, total.elapsed = start, time.Since(start)
	return total
}
