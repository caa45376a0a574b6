package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// run is the whole program behind main, so tests can drive it against a fake
// service. It returns an error when the setup fails or a scenario's balances do
// not verify; the scenarios' reports are written to stdout either way.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil // the usage is printed
	}
	if err != nil {
		return err
	}
	cl := newClient(cfg.baseURL, cfg.apiKey, cfg.clients, cfg.timeout)
	if err := cl.waitReady(ctx, cfg.readyTimeout); err != nil {
		return err
	}
	var failed []string
	for _, name := range cfg.scenarios {
		res, err := runScenario(ctx, cl, cfg, name)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		if cfg.json {
			err = res.writeJSON(stdout)
		} else {
			err = res.writeText(stdout)
		}
		if err != nil {
			return err
		}
		if !res.Verified {
			failed = append(failed, name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("balances do not match what succeeded in scenario %s", strings.Join(failed, ", "))
	}
	return nil
}

// runScenario opens the scenario's accounts, prepares its workload, drives it
// with the clock running, settles keys left without a final answer and
// verifies every account's balance.
func runScenario(ctx context.Context, cl *client, cfg config, name string) (result, error) {
	prefix := "bench-" + cfg.runID + "-" + name + "-"
	led := newLedger()
	accounts, err := scenarioAccounts(ctx, cl, cfg, name, prefix, led)
	if err != nil {
		return result{}, err
	}
	load, err := newWorkload(ctx, cl, cfg, name, prefix, accounts, led)
	if err != nil {
		return result{}, err
	}
	var cpu0 int64
	if cfg.servicePID > 0 {
		if cpu0, err = processCPUTicks(cfg.servicePID); err != nil {
			return result{}, err
		}
	}
	var machine0 cpuSample
	if cfg.cpu {
		if machine0, err = sampleCPU(); err != nil {
			return result{}, fmt.Errorf("-cpu: %w", err)
		}
	}
	var events *eventWatch
	if cfg.eventsURL != "" {
		if events, err = watchEvents(cfg.eventsURL); err != nil {
			return result{}, err
		}
		events.start(time.Now())
	}
	var held *heldKeyClient
	if len(accounts) > 0 {
		held = startHeldKey(ctx, cl, cfg, accounts[0], led)
	}
	st := drive(ctx, cl, load, cfg, led)
	var cpu *int64
	if cfg.servicePID > 0 {
		cpu1, err := processCPUTicks(cfg.servicePID)
		if err != nil {
			return result{}, err
		}
		d := cpu1 - cpu0
		cpu = &d
	}
	var cpuTicks map[string]int64
	if cfg.cpu {
		machine1, err := sampleCPU()
		if err != nil {
			return result{}, fmt.Errorf("-cpu: %w", err)
		}
		cpuTicks = cpuBetween(machine0, machine1, cfg.servicePID, cfg.processorPID)
	}
	heldStatuses := held.stop()
	var delays *histogram
	if events != nil {
		// After the CPU is read: the wait for the last events is not the run's.
		h := events.finish(st.start.Add(st.elapsed), st.charges, eventGrace)
		delays = &h
	}
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	settled, err := settle(ctx, cl, setupWorkers(cfg.clients), led)
	if err != nil {
		return result{}, fmt.Errorf("settle: %w", err)
	}
	balances, err := fetchBalances(ctx, cl, setupWorkers(cfg.clients), accounts)
	if err != nil {
		return result{}, fmt.Errorf("read balances: %w", err)
	}
	v := led.verify(balances)
	res := newResult(name, cfg.clients, st, settled, v)
	res.ServiceCPUTicks, res.CPUTicks, res.HeldKeyStatuses = cpu, cpuTicks, heldStatuses
	if delays != nil {
		res.Events = &eventDelays{
			Count: int64(delays.n), P50ms: millis(delays.quantile(0.50)),
			P99ms: millis(delays.quantile(0.99)), MaxMs: millis(delays.max),
		}
	}
	return res, nil
}

// scenarioAccounts opens the scenario's funded accounts; the card scenario
// has none, its charges naming a payment method instead.
func scenarioAccounts(ctx context.Context, cl *client, cfg config, name, prefix string, led *ledger) ([]string, error) {
	if name == cardScenario {
		return nil, nil
	}
	accounts, err := openAccounts(ctx, cl, cfg, prefix, led)
	if err != nil {
		return nil, fmt.Errorf("open accounts: %w", err)
	}
	return accounts, nil
}
