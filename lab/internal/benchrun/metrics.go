package benchrun

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sample is one reading of the metrics the targets need.
type Sample struct {
	UnixMs            int64
	GCCycles          float64
	HeapInuse         float64
	HeapAlloc         float64
	CacheEntries      float64
	KeysInFlight      float64
	JanitorDeleted    float64
	Goroutines        float64
	OutboxBacklog     float64
	OldestUnpublished float64
}

// Line is the sample as the files in bin/ hold it: unix_ms gc_cycles
// heap_inuse heap_alloc cache_entries keys_in_flight janitor_deleted
// goroutines outbox_backlog oldest_unpublished_seconds.
func (s Sample) Line() string {
	return fmt.Sprintf("%d %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.1f", s.UnixMs, s.GCCycles, s.HeapInuse,
		s.HeapAlloc, s.CacheEntries, s.KeysInFlight, s.JanitorDeleted, s.Goroutines, s.OutboxBacklog, s.OldestUnpublished)
}

// TakeSample reads GET metricsURL/metrics. It fails when /metrics did not
// answer or lacks the GC, janitor or outbox series.
func TakeSample(ctx context.Context, metricsURL string) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL+"/metrics", nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	s := Sample{UnixMs: time.Now().UnixMilli()}
	targets := map[string]*float64{
		"go_gc_duration_seconds_count":               &s.GCCycles,
		"go_memstats_heap_inuse_bytes":               &s.HeapInuse,
		"go_memstats_heap_alloc_bytes":               &s.HeapAlloc,
		"payments_idempotency_cache_entries":         &s.CacheEntries,
		"payments_idempotency_keys_in_flight":        &s.KeysInFlight,
		"payments_janitor_deleted_keys_total":        &s.JanitorDeleted,
		"go_goroutines":                              &s.Goroutines,
		"payments_outbox_backlog_events":             &s.OutboxBacklog,
		"payments_outbox_oldest_unpublished_seconds": &s.OldestUnpublished,
	}
	seen, err := readSeries(resp.Body, targets)
	if err != nil {
		return Sample{}, err
	}
	for _, required := range []string{"go_gc_duration_seconds_count", "payments_janitor_deleted_keys_total", "payments_outbox_backlog_events"} {
		if !seen[required] {
			return Sample{}, fmt.Errorf("/metrics has no %s", required)
		}
	}
	return s, nil
}

// readSeries sets each target from its unlabelled series in the Prometheus
// text format.
func readSeries(r io.Reader, targets map[string]*float64) (map[string]bool, error) {
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		if p, ok := targets[f[0]]; ok {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				*p, seen[f[0]] = v, true
			}
		}
	}
	return seen, sc.Err()
}

// Sampler samples in the background every interval into a file.
type Sampler struct {
	stop chan struct{}
	done chan struct{}
}

// StartSampler writes a Sample.Line to path every interval until Stop.
func StartSampler(metricsURL, path string, interval time.Duration) (*Sampler, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer f.Close()
		for {
			if sample, err := TakeSample(context.Background(), metricsURL); err == nil {
				fmt.Fprintln(f, sample.Line())
			}
			select {
			case <-s.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	return s, nil
}

// Stop ends the sampling; the file is complete when it returns.
func (s *Sampler) Stop() {
	close(s.stop)
	<-s.done
}

// Settled is what SettleHeap saw: the sample after the second GC cycle at
// idle (or the last one), the seconds until idle (-1: never) and in all,
// and whether it settled before the timeout.
type Settled struct {
	Sample
	First     Sample // the first sample: the service as the load left it
	IdleAfter int
	Took      int
	OK        bool
}

// SettleHeap polls /metrics every 0.1 s until the service is idle (the
// relay has published the whole outbox backlog the run left) and then two
// GC cycles have completed: one cycle leaves what sync.Pool holds in its
// victim cache, the second frees it. At idle only the scrapes allocate, so
// the runtime keeps collecting. Every sample goes to path.
func SettleHeap(ctx context.Context, metricsURL, path string, timeout time.Duration) (Settled, error) {
	f, err := os.Create(path)
	if err != nil {
		return Settled{}, err
	}
	defer f.Close()
	began := time.Now()
	seconds := func() int { return int(time.Since(began).Seconds()) }
	out := Settled{IdleAfter: -1}
	gc0 := -1.0
	for {
		if s, err := TakeSample(ctx, metricsURL); err == nil {
			fmt.Fprintln(f, s.Line())
			if out.First.UnixMs == 0 {
				out.First = s
			}
			out.Sample = s
			switch {
			case gc0 < 0 && s.OutboxBacklog == 0:
				gc0, out.IdleAfter = s.GCCycles, seconds()
			case gc0 >= 0 && s.GCCycles >= gc0+2:
				out.Took, out.OK = seconds(), true
				return out, nil
			}
		}
		if time.Since(began) >= timeout {
			out.Took = seconds()
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
