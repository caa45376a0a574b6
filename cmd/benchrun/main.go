// Command benchrun orchestrates the benchmarks that write docs/benchmarks.md:
//
//	benchrun bench   make bench: issue 5's targets, group commit against its
//	                 baseline (issue 12), CPU per charge by part (issue 24)
//	benchrun sync    make bench-sync: the cost of synchronous replication
//	                 (issue 15), its own section of the report
//
// It runs from the repository's root (scripts/bench.sh and bench-sync.sh
// build it and run it there), starts the service, NATS, the load generator
// (bin/paymentsbench) and pg-reference as child processes on scratch
// databases, and stops and drops all of them when it ends, interrupted or
// not. Its settings are environment variables, listed by each subcommand's
// file (bench.go, sync.go).
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	commands := map[string]func(context.Context, *log.Logger) error{
		"bench": runBench,
		"sync":  runSync,
	}
	if len(os.Args) != 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: benchrun bench|sync (make bench, make bench-sync)")
		os.Exit(2)
	}
	prefix := map[string]string{"bench": "bench: ", "sync": "bench-sync: "}[os.Args[1]]
	logger := log.New(os.Stderr, prefix, 0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := commands[os.Args[1]](ctx, logger)
	stop()
	if err != nil {
		logger.Print(err)
		os.Exit(1)
	}
}
