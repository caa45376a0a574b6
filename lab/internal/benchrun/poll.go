package benchrun

import (
	"context"
	"sync"
	"time"
)

// Reading is one Scrape of a Poller: the values of its series at UnixMs.
type Reading struct {
	UnixMs int64
	Values map[string]float64
}

// Poller scrapes a service's /metrics in the background (the connection
// pool's gauges during a measured run), keeping every reading in memory.
// A scrape that fails is skipped.
type Poller struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	readings []Reading
}

// StartPoller scrapes names from metricsURL (a Service's MetricsURL) now
// and every interval until Stop.
func StartPoller(metricsURL string, interval time.Duration, names ...string) *Poller {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Poller{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			if values, err := Scrape(ctx, metricsURL, names...); err == nil {
				p.mu.Lock()
				p.readings = append(p.readings, Reading{UnixMs: time.Now().UnixMilli(), Values: values})
				p.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return p
}

// Stop ends the polling and returns the readings in the order taken. It
// may be called on nil, which has none.
func (p *Poller) Stop() []Reading {
	if p == nil {
		return nil
	}
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readings
}

// Within is the readings taken from fromMs to toMs, both included.
func Within(readings []Reading, fromMs, toMs int64) []Reading {
	var out []Reading
	for _, r := range readings {
		if r.UnixMs >= fromMs && r.UnixMs <= toMs {
			out = append(out, r)
		}
	}
	return out
}

// Sleep waits d, or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
