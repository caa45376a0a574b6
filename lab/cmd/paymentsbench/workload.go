package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// workload decides which charge each request of a run sends.
type workload interface {
	// next returns the n-th request of the run, counting from 0 across all
	// clients; elapsed is the time since the clock started. It is called from
	// every client at once.
	next(n int64, elapsed time.Duration) chargeRequest
}

// newWorkload builds the named scenario over accounts. Keys start with prefix.
// The replay scenario completes its charges here, before the clock starts, and
// records them in led.
func newWorkload(ctx context.Context, cl *client, cfg config, name, prefix string, accounts []string, led *ledger) (workload, error) {
	fresh := freshLoad{prefix: prefix, accounts: accounts, amount: cfg.amount}
	switch name {
	case "fresh":
		return fresh, nil
	case "replay":
		return newReplayLoad(ctx, cl, cfg.clients, fresh, cfg.replayKeys, led)
	case "storm":
		return stormLoad{prefix: prefix, accounts: accounts, amount: cfg.amount,
			perKey: cfg.stormPerKey, interval: cfg.stormInterval}, nil
	case "mixed":
		return &mixedLoad{fresh: fresh, retry: cfg.mixedRetry}, nil
	case cardScenario:
		return cardLoad{prefix: prefix, method: cfg.paymentMethod, amount: cfg.amount}, nil
	}
	return nil, fmt.Errorf("unknown scenario %q", name)
}

// freshLoad sends a new key every time, charging an account picked at random,
// as pg-reference does.
type freshLoad struct {
	prefix   string
	accounts []string
	amount   int64
}

func (f freshLoad) next(n int64, _ time.Duration) chargeRequest {
	return chargeRequest{
		key:     f.prefix + strconv.FormatInt(n, 10),
		account: f.accounts[rand.IntN(len(f.accounts))],
		amount:  f.amount,
	}
}

// cardLoad sends a new key every time, each a charge of one payment method at
// the card processor.
type cardLoad struct {
	prefix string
	method string
	amount int64
}

func (c cardLoad) next(n int64, _ time.Duration) chargeRequest {
	return chargeRequest{key: c.prefix + strconv.FormatInt(n, 10), paymentMethod: c.method, amount: c.amount}
}

// replayLoad resends, in turn, requests whose charges completed before the run.
type replayLoad struct{ done []chargeRequest }

// newReplayLoad completes keys fresh charges with clients concurrent clients,
// records their answers in led, and returns the workload replaying them.
func newReplayLoad(ctx context.Context, cl *client, clients int, fresh freshLoad, keys int, led *ledger) (replayLoad, error) {
	fresh.prefix += "done-"
	done := make([]chargeRequest, keys)
	for i := range done {
		done[i] = fresh.next(int64(i), 0)
	}
	err := parallel(ctx, clients, keys, func(ctx context.Context, i int) error {
		a, err := retry(ctx, func() (answer, error) {
			a, err := cl.charge(ctx, done[i])
			if err == nil && !a.final() {
				err = &statusError{"POST /v1/charges", a}
			}
			return a, err
		})
		if err != nil {
			return fmt.Errorf("complete the charges to replay: %w", err)
		}
		led.record(done[i], a)
		return nil
	})
	return replayLoad{done: done}, err
}

func (r replayLoad) next(n int64, _ time.Duration) chargeRequest {
	return r.done[n%int64(len(r.done))]
}

// stormLoad makes every client send the same request: one key at a time, the
// next key after perKey requests, or after interval when that is set.
type stormLoad struct {
	prefix   string
	accounts []string
	amount   int64
	perKey   int64
	interval time.Duration
}

func (s stormLoad) next(n int64, elapsed time.Duration) chargeRequest {
	k := n / s.perKey
	if s.interval > 0 {
		k = int64(elapsed / s.interval)
	}
	return chargeRequest{
		key:     s.prefix + strconv.FormatInt(k, 10),
		account: s.accounts[k%int64(len(s.accounts))],
		amount:  s.amount,
	}
}

// recentKeys is how many of the latest fresh requests mixed may retry.
const recentKeys = 1024

// mixedLoad sends fresh charges, and with probability retry resends one of the
// recentKeys latest fresh requests instead, as clients retrying after a timeout
// do; some of those are still in flight.
type mixedLoad struct {
	fresh freshLoad
	retry float64

	mu     sync.Mutex
	recent [recentKeys]chargeRequest
	sent   int // fresh requests so far
}

func (m *mixedLoad) next(n int64, elapsed time.Duration) chargeRequest {
	retry := rand.Float64() < m.retry
	m.mu.Lock()
	defer m.mu.Unlock()
	if retry && m.sent > 0 {
		return m.recent[rand.IntN(min(m.sent, recentKeys))]
	}
	r := m.fresh.next(n, elapsed)
	m.recent[m.sent%recentKeys] = r
	m.sent++
	return r
}
