// Command benchrun orchestrates the service's benchmarks:
//
//	benchrun bench       make bench: the service against the database's
//	                     ceiling and its stated bounds, group commit against
//	                     its baseline, CPU per charge by part; writes
//	                     docs/benchmarks.md (BENCH_REPORT: elsewhere)
//	benchrun sync        make bench-sync: the cost of synchronous
//	                     replication, its own section of the report
//	benchrun pair        make bench-pair: two builds of the service paired, the
//	                     relay on and off, CPU per charge by part
//	benchrun batch-cost  make batch-cost: what a charge batch costs apart from
//	                     its charges
//	benchrun processor   make bench-processor: card charges at the processor
//	                     simulator, answering at once and after 50 ms, against
//	                     account charges; its own section of the report
//	benchrun isolation   make bench-isolation: does one merchant slow
//	                     another? its own section of the report
//
// It runs from the repository's root (scripts/bench.sh, bench-sync.sh,
// bench-pair.sh, batch-cost.sh and bench-processor.sh build it and run it
// there), starts the service, NATS, the load generator (bin/paymentsbench),
// the card processor simulator (bin/procsim) and pg-reference as child
// processes on scratch databases, and stops and drops all of them
// when it ends, interrupted or not. Its settings are environment variables,
// listed by each subcommand's file (bench.go, sync.go, pair.go,
// batchcost.go, proc.go).
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
		"bench":      runBench,
		"sync":       runSync,
		"pair":       runPair,
		"batch-cost": runBatchCost,
		"processor":  runProcessor,
		"isolation":  runIsolation,
	}
	if len(os.Args) != 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: benchrun bench|sync|pair|batch-cost|processor|isolation (make bench, bench-sync, bench-pair, batch-cost, bench-processor, bench-isolation)")
		os.Exit(2)
	}
	prefix := map[string]string{"bench": "bench: ", "sync": "bench-sync: ", "pair": "bench-pair: ",
		"batch-cost": "batch-cost: ", "processor": "bench-processor: ", "isolation": "bench-isolation: "}[os.Args[1]]
	logger := log.New(os.Stderr, prefix, 0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := commands[os.Args[1]](ctx, logger)
	stop()
	if err != nil {
		logger.Print(err)
		os.Exit(1)
	}
}
