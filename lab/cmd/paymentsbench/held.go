package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// heldKeyPause is how long the -held-key client waits between attempts, so an
// answer that comes at once (not the wait for the key) does not spin.
const heldKeyPause = 20 * time.Millisecond

// heldKeyClient keeps retrying one charge whose key another party holds in
// flight (-held-key), as a client retrying after a 409 in use does.
type heldKeyClient struct {
	done     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	statuses map[string]int64
}

// startHeldKey starts the -held-key client on account, or returns nil when
// there is none. A final answer is recorded in led (the holder gave up and the
// charge ran); the others are only counted, since the key may never settle.
func startHeldKey(ctx context.Context, cl *client, cfg config, account string, led *ledger) *heldKeyClient {
	if cfg.heldKey == "" {
		return nil
	}
	h := &heldKeyClient{done: make(chan struct{}), statuses: map[string]int64{}}
	req := chargeRequest{key: cfg.heldKey, account: account, amount: cfg.amount}
	h.wg.Go(func() {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.done:
				return
			case <-t.C:
			}
			a, err := cl.charge(ctx, req)
			label := "none"
			if err == nil {
				label = strconv.Itoa(a.status)
				if a.final() {
					led.record(req, a)
				}
			}
			h.mu.Lock()
			h.statuses[label]++
			h.mu.Unlock()
			t.Reset(heldKeyPause)
		}
	})
	return h
}

// stop ends the client once its request in flight has its answer (so the
// ledger knows every outcome), and returns its answers by status; nil when
// there was no client.
func (h *heldKeyClient) stop() map[string]int64 {
	if h == nil {
		return nil
	}
	close(h.done)
	h.wg.Wait()
	return h.statuses
}

// processCPUTicks returns the user plus system CPU time of process pid so far,
// in clock ticks.
func processCPUTicks(pid int) (int64, error) {
	n, err := benchrun.ProcessCPUTicks(pid)
	if err != nil {
		return 0, fmt.Errorf("-service-pid: %w", err)
	}
	return n, nil
}
