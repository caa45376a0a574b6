package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// openAccounts opens cfg.accounts USD accounts, funds each with cfg.balance and
// records the deposits in led. Keys derive from prefix, so a retry after a lost
// answer is the same request and opens nothing twice.
func openAccounts(ctx context.Context, cl *client, cfg config, prefix string, led *ledger) ([]string, error) {
	accounts := make([]string, cfg.accounts)
	err := parallel(ctx, setupWorkers(cfg.clients), cfg.accounts, func(ctx context.Context, i int) error {
		key := prefix + "acct-" + strconv.Itoa(i)
		id, err := cl.createAccount(ctx, key)
		if err != nil {
			return err
		}
		accounts[i] = id
		left := cfg.balance
		for j := 0; left > 0; j++ {
			amount := min(left, maxAmount)
			key := prefix + "dep-" + strconv.Itoa(i) + "-" + strconv.Itoa(j)
			if err := cl.deposit(ctx, id, key, amount); err != nil {
				return err
			}
			led.deposit(id, amount)
			left -= amount
		}
		return nil
	})
	return accounts, err
}

// minSetupWorkers is the least concurrency of the work around a measured run
// (opening accounts, settling, reading balances), so a run with one client
// does not spend longer on its setup than on its measurement.
const minSetupWorkers = 16

// setupWorkers is how many requests the work around a run with clients
// clients sends at once.
func setupWorkers(clients int) int { return max(clients, minSetupWorkers) }

// fetchBalances reads the balance of every account.
func fetchBalances(ctx context.Context, cl *client, clients int, accounts []string) (map[string]int64, error) {
	var mu sync.Mutex
	balances := make(map[string]int64, len(accounts))
	err := parallel(ctx, clients, len(accounts), func(ctx context.Context, i int) error {
		b, err := cl.balance(ctx, accounts[i])
		if err != nil {
			return err
		}
		mu.Lock()
		balances[accounts[i]] = b
		mu.Unlock()
		return nil
	})
	return balances, err
}

// settleAttempts bounds how often settle resends one key.
const settleAttempts = 20

// settle resends, with the same key and body, every charge that got no final
// answer during the run (no answer, 409 in use, 5xx), until the service gives
// its stored outcome. That is what a real client does, and it leaves every key
// with a known effect on the balances. It returns how many keys it resent; a key
// still unsettled after settleAttempts stays so in the ledger.
func settle(ctx context.Context, cl *client, clients int, led *ledger) (int, error) {
	pending := led.unsettled()
	err := parallel(ctx, clients, len(pending), func(ctx context.Context, i int) error {
		for attempt := 1; attempt <= settleAttempts; attempt++ {
			a, err := cl.charge(ctx, pending[i])
			if err == nil {
				led.record(pending[i], a)
				if a.final() {
					return nil
				}
			}
			if err := sleep(ctx, time.Duration(attempt)*100*time.Millisecond); err != nil {
				return err
			}
		}
		return nil
	})
	return len(pending), err
}

// retry calls f until it succeeds, up to 5 times with a growing pause, as long
// as it fails with no answer or a temporary one. Callers only retry idempotent
// requests: the same key, the same body. It completes the charges a replay run
// resends, which go through the bench's own charge, not the payments client,
// since their answers are recorded in the ledger as the measured ones are.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for attempt := 1; attempt <= 5; attempt++ {
		if v, err = f(); err == nil {
			return v, nil
		}
		if se := (*statusError)(nil); errors.As(err, &se) && !se.temporary() {
			return v, err
		}
		if err := sleep(ctx, time.Duration(attempt)*200*time.Millisecond); err != nil {
			return v, err
		}
	}
	return v, fmt.Errorf("after 5 attempts: %w", err)
}

// parallel calls f for 0..n-1 from up to workers goroutines and returns the
// first error, which also cancels the context the other calls see.
func parallel(ctx context.Context, workers, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// sleep pauses for d, or returns the context's error if it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if !benchrun.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}
