package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"
)

// maxAmount is the largest amount the API accepts in one deposit or charge.
const maxAmount = 99_999_999

// scenarioNames are the scenarios in the order they run by default.
var scenarioNames = []string{"fresh", "replay", "storm", "mixed"}

// cardScenario charges a payment method at the service's card processor
// instead of an account. It runs only when named: a service without a
// processor (PROCESSOR_URL) refuses it.
const cardScenario = "card"

// config is the command line of paymentsbench.
type config struct {
	baseURL string
	apiKey  string

	clients   int
	duration  time.Duration
	requests  int64 // per scenario; 0 means run for duration
	scenarios []string

	accounts   int
	balance    int64 // deposited into each account
	amount     int64 // of each charge
	replayKeys int

	stormPerKey   int64
	stormInterval time.Duration
	mixedRetry    float64

	timeout      time.Duration
	readyTimeout time.Duration
	json         bool
	runID        string

	// servicePID, when set, is the service's process: its CPU time over the
	// measured run is reported (Linux /proc).
	servicePID int
	cpu        bool
	// heldKey, when set, is a key another party holds in flight: one extra
	// client keeps retrying a charge with it during the measured run.
	heldKey string
	// eventsURL, when set, is the NATS the relay publishes to: the delay of
	// each charge's event to a subscriber there is reported.
	eventsURL string
	// paymentMethod is what the card scenario charges (pm_card_approve).
	paymentMethod string
	// processorPID, when set with -cpu, is the card processor's process (the
	// simulator): its CPU time is reported apart from the service's.
	processorPID int
}

// parseConfig reads the flags in args; the API key defaults to
// $PAYMENTS_API_KEY. It returns flag.ErrHelp for -h, and an error naming the
// flag for a value that cannot work.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (config, error) {
	var c config
	var scenarios string
	fs := flag.NewFlagSet("paymentsbench", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&c.baseURL, "url", "http://127.0.0.1:8080", "base URL of the running service")
	// No default from the environment: -h would print the secret.
	fs.StringVar(&c.apiKey, "api-key", "", "merchant API key (default $PAYMENTS_API_KEY)")
	fs.IntVar(&c.clients, "c", 16, "concurrent clients")
	fs.DurationVar(&c.duration, "d", 10*time.Second, "how long each scenario runs")
	fs.Int64Var(&c.requests, "n", 0, "requests per scenario; when set, it replaces -d")
	fs.StringVar(&scenarios, "scenarios", strings.Join(scenarioNames, ","), "scenarios to run, comma separated")
	fs.IntVar(&c.accounts, "accounts", 1000, "accounts each scenario opens and spreads its charges over")
	fs.Int64Var(&c.balance, "balance", maxAmount, "money deposited into each account (in deposits of at most 99999999)")
	fs.Int64Var(&c.amount, "amount", 100, "amount of each charge")
	fs.IntVar(&c.replayKeys, "replay-keys", 1000, "charges the replay scenario completes before the clock starts")
	fs.Int64Var(&c.stormPerKey, "storm-per-key", 64, "storm: requests sent for one key before moving to the next")
	fs.DurationVar(&c.stormInterval, "storm-interval", 0, "storm: move to the next key this often instead (0: use -storm-per-key)")
	fs.Float64Var(&c.mixedRetry, "mixed-retry", 0.3, "mixed: share of requests that retry a recent key")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "timeout of one HTTP request")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 30*time.Second, "how long to wait for GET /readyz to answer 200 before starting")
	fs.BoolVar(&c.json, "json", false, "print each scenario as one JSON object per line")
	fs.StringVar(&c.runID, "run-id", "", "prefix of every Idempotency-Key (default: random), so runs never share keys")
	fs.IntVar(&c.servicePID, "service-pid", 0, "process id of the service (same machine): report its CPU time over the measured run, from /proc/PID/stat")
	fs.BoolVar(&c.cpu, "cpu", false, "report the CPU time over each measured run of the machine, the service (-service-pid), PostgreSQL, nats-server and paymentsbench, from /proc")
	fs.StringVar(&c.heldKey, "held-key", "", "an Idempotency-Key held in flight elsewhere: one extra client keeps retrying a charge with it on the first account during the run; its answers are counted apart")
	fs.StringVar(&c.paymentMethod, "payment-method", "pm_card_approve", "card: the payment method each charge names instead of an account (the simulator's test cards: docs/processors.md)")
	fs.IntVar(&c.processorPID, "processor-pid", 0, "process id of the card processor (same machine, the simulator): with -cpu, report its CPU time apart")
	fs.StringVar(&c.eventsURL, "events-url", "", "NATS URL the service's relay publishes to: report how long each charge's event takes from its transaction's start to a subscriber there")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.scenarios = append(c.scenarios, s)
		}
	}
	if c.apiKey == "" {
		c.apiKey = getenv("PAYMENTS_API_KEY")
	}
	if c.runID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.runID = hex.EncodeToString(b[:])
	}
	return c, c.validate()
}

// validate names the first flag whose value cannot work.
func (c config) validate() error {
	u, err := url.Parse(c.baseURL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("-url: want an http(s) base URL, got %q", c.baseURL)
	case c.apiKey == "":
		return errors.New("-api-key: missing (or set PAYMENTS_API_KEY); create one with: payments merchants create --name bench")
	case c.clients < 1:
		return fmt.Errorf("-c: want at least 1 client, got %d", c.clients)
	case c.requests < 0 || (c.requests == 0 && c.duration <= 0):
		return errors.New("-d or -n: want a positive duration or request count")
	case len(c.scenarios) == 0:
		return errors.New("-scenarios: name at least one")
	case c.accounts < 1:
		return fmt.Errorf("-accounts: want at least 1, got %d", c.accounts)
	case c.amount < 1 || c.amount > maxAmount:
		return fmt.Errorf("-amount: want 1..%d, got %d", maxAmount, c.amount)
	case c.balance < c.amount:
		return fmt.Errorf("-balance: want at least -amount (%d), got %d", c.amount, c.balance)
	case c.replayKeys < 1:
		return fmt.Errorf("-replay-keys: want at least 1, got %d", c.replayKeys)
	case c.stormPerKey < 1:
		return fmt.Errorf("-storm-per-key: want at least 1, got %d", c.stormPerKey)
	case c.mixedRetry < 0 || c.mixedRetry > 1:
		return fmt.Errorf("-mixed-retry: want 0..1, got %g", c.mixedRetry)
	case c.timeout <= 0:
		return errors.New("-timeout: want a positive duration")
	case c.servicePID < 0:
		return fmt.Errorf("-service-pid: want a process id, got %d", c.servicePID)
	case len(c.heldKey) > 255 || strings.ContainsFunc(c.heldKey, func(r rune) bool { return r <= ' ' || r > '~' }):
		return errors.New("-held-key: want 1-255 visible ASCII characters")
	case c.paymentMethod == "" || strings.ContainsFunc(c.paymentMethod, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' || r == '\\' }):
		return fmt.Errorf("-payment-method: want a payment method like pm_card_approve, got %q", c.paymentMethod)
	case c.processorPID < 0:
		return fmt.Errorf("-processor-pid: want a process id, got %d", c.processorPID)
	}
	for _, s := range c.scenarios {
		if !slices.Contains(scenarioNames, s) && s != cardScenario {
			return fmt.Errorf("-scenarios: unknown scenario %q (want %s or %s)", s, strings.Join(scenarioNames, ", "), cardScenario)
		}
		if s == cardScenario && c.heldKey != "" {
			return errors.New("-held-key: it retries an account charge; the card scenario has no account")
		}
	}
	return nil
}
