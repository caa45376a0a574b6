// Command paymentsbench is a load generator for a running payments service.
//
// It opens its own funded accounts, drives POST /v1/charges over HTTP with
// concurrent clients in one or more scenarios, prints throughput, latency
// percentiles and answers by status, and then checks through the API that every
// account's balance equals its deposits minus the charges that succeeded: no
// charge was lost and none was made twice.
//
//	paymentsbench -url http://127.0.0.1:8080 -api-key sk_... -c 16 -d 10s
//
// Scenarios (-scenarios, comma separated, all by default):
//
//	fresh   a new Idempotency-Key on every request: one new charge each
//	replay  the exact requests of charges completed before the clock starts
//	storm   every client sends the same request (one key) at once, moving on
//	        to a new key every -storm-per-key requests or -storm-interval
//	mixed   fresh charges plus retries of recent keys (-mixed-retry of them)
//
// and, only when named, since it needs a service with a card processor:
//
//	card    a new key on every request, each a charge of -payment-method at
//	        the processor (pm_card_approve, pm_card_slow, ...) instead of an
//	        account; 201, 202 (processing) and 402 (declined) are counted
//	        apart, and with no account there is no balance to check: every
//	        key must get one final answer (a 202 is resent until it has one)
//
// For make bench's group-commit measurements: -service-pid reports the
// service's CPU time over each measured run (from /proc/PID/stat, in clock
// ticks), -cpu adds the machine's, PostgreSQL's, nats-server's and (with
// -processor-pid) the card processor's, and -held-key adds one client that keeps retrying a charge whose key
// another party holds in flight, its answers counted apart.
//
// The API key comes from -api-key or $PAYMENTS_API_KEY. With -json each scenario
// is printed as one JSON object on its own line. The exit status is non-zero when
// a balance does not match.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "paymentsbench:", err)
		os.Exit(1)
	}
}
