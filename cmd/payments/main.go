// Command payments runs the payment-charging service and its operator tasks.
//
//	payments serve                        run the HTTP API (and the outbox relay)
//	payments relay                        run only the outbox relay to NATS JetStream
//	payments consume                      run the worked-example event consumer
//	payments migrate up|down|version      manage the database schema
//	payments migrate force VERSION        record VERSION after a failed migration was repaired by hand
//	payments merchants create --name N    register a merchant, print its API key
//	payments merchants list               list the merchants and their active API keys, a page at a time
//	payments api-keys create|list|revoke  create, list and revoke merchants' API keys
//	payments charges resolve CHARGE_ID    settle a card charge in review (audited)
//	payments reconcile --since T          compare card charges with the processor's records (exit 2: mismatches)
//	payments healthcheck [--url URL]      exit 0 when the running service is ready
//	payments version [--json]             print the version, commit, build time and Go version
//
// Every command takes -h: it prints the command's usage to stdout and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	// The first SIGTERM or SIGINT starts serve's drain; a second one cuts
	// its SHUTDOWN_DELAY short (drain.go).
	ctx, stop := shutdownSignals(context.Background())
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(exitCode(err)) // 1, or 2 for a reconciliation's mismatches
	}
}

const usage = `usage:
  payments serve [flags]                   run the HTTP API (and the outbox relay, RELAY_ENABLED)
  payments relay [flags]                   run only the outbox relay to NATS JetStream
  payments consume [flags]                 run the worked-example consumer (balance projection)
  payments migrate up|down|version         manage the database schema
  payments migrate force VERSION           record VERSION as applied after a failed migration was repaired by hand
  payments merchants create --name NAME    register a merchant and print its API key
  payments merchants list [--limit N] [--starting-after MERCHANT_ID]
                                           list the merchants, oldest first, 100 a page by default: ids,
                                           names, creation, active API keys
  payments api-keys create --merchant ID   give the merchant another API key (printed once)
  payments api-keys list --merchant ID     list the merchant's keys: ids, creation, last use, revocation
  payments api-keys revoke KEY_ID          revoke a key: every replica refuses it within 2 s
  payments charges resolve CHARGE_ID --as succeeded|failed --reason TEXT --operator NAME
                                           settle a card charge in requires_review (audited); prints it
  payments reconcile --since T [--until T] [--format json|csv]
                                           compare card charges with the processor's records, a line per
                                           reference; exit 2 when some disagree, 1 when it cannot run
  payments healthcheck [--url URL]         exit 0 when the service at HTTP_ADDR answers /readyz with 200
  payments version [--json]                print the version, commit, build time and Go version

"payments COMMAND -h" lists the settings COMMAND reads, by room; each flag overrides its environment
variable, and a variable of another command is ignored (docs/operations.md has them all).`

// run is the whole program behind main, so tests can drive the real wiring.
// A command asked for help (-h) has printed it to stdout, and succeeds.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("missing command\n%s", usage)
	}
	var cmd func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error
	switch args[0] {
	case "serve":
		cmd = serve
	case "relay":
		cmd = relayOnly
	case "consume":
		cmd = consume
	case "migrate":
		cmd = migrate
	case "merchants":
		cmd = merchants
	case "api-keys":
		cmd = apiKeys
	case "charges":
		cmd = charges
	case "reconcile":
		cmd = reconcileCommand
	case "healthcheck":
		cmd = healthcheck
	case "version":
		cmd = printVersion
	case "help", "-h", "-help", "--help":
		_, err := fmt.Fprintln(stdout, usage)
		return err
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
	err := cmd(ctx, args[1:], getenv, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}
