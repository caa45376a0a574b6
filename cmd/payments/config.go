package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/webhook"
)

// config is a command's configuration: environment variables, each
// overridable by a flag, grouped by room (rooms.go). A command reads only its
// rooms' settings; the others keep their zero values.
type config struct {
	DatabaseURL string // database
	Pool        poolConfig
	HTTP        httpConfig
	Shutdown    shutdownConfig
	Keys        keysConfig
	Charges     chargesConfig
	Processor   processorConfig
	Parts       partsConfig
	NATSURL     string // nats
	Relay       relayConfig
	// WebhookAllowPrivate lets webhook endpoints have http URLs and local
	// addresses: development and tests only.
	WebhookAllowPrivate bool
	MetricsAddr         string // metrics; "" when off
	Monitor             monitorConfig
	LogLevel            slog.Level
	MigrateWait         time.Duration // migrations
}

// poolConfig: a command's connection pool and the bounds on its waits.
// KeyWait is IDEMPOTENCY_WAIT, which bounds more than keys (storeOptions).
type poolConfig struct {
	MaxConns            int32
	KeyWait, CommitWait time.Duration
}

type httpConfig struct {
	Addr           string
	TrustedProxies []netip.Prefix
	AccessLog      httpapi.AccessLog
	Budget         httpapi.MerchantBudget
}

type shutdownConfig struct{ Delay, Timeout time.Duration }

type keysConfig struct {
	TTL             time.Duration
	CacheSize       int
	CacheBytes      int64
	JanitorInterval time.Duration
	JanitorBatch    int
}

type chargesConfig struct {
	BatchSize, Batches               int
	AuthorizationTTL, ExpiryInterval time.Duration
}

// processorConfig: the card processor (kind), the simulator at URL or
// Stripe. None: card charges are refused.
type processorConfig struct {
	Kind, URL, WebhookSecret                          string
	Stripe                                            stripeConfig
	Wait, Timeout, DecisionDeadline, RecoveryInterval time.Duration
}

// stripeConfig: the Stripe account (PROCESSOR=stripe).
type stripeConfig struct{ APIKey, APIBase, Account, WebhookSecret string }

// partsConfig: what serve runs beside the API. PprofAddr "" is no profiler.
type partsConfig struct {
	Relay, WebhookDelivery bool
	PprofAddr              string
}

type relayConfig struct {
	Batch                int
	Poll, EventRetention time.Duration
}

// monitorConfig: serve's sampling of the outbox for its gauges and warning.
type monitorConfig struct{ Sample, HeldWarn time.Duration }

// loadConfig reads the environment, then the flags in args, of the command
// name ("serve", "migrate up"): the settings of its rooms, and no others.
// A bad value is an error naming the variable or flag it came from. -h
// prints the settings to stdout (parseFlags).
func loadConfig(name string, args []string, getenv func(string) string, stdout, stderr io.Writer) (config, error) {
	cmd := commandNamed(name)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	load := addSettings(fs, name, getenv)
	if err := parseFlags(fs, args, cmd.usage(), stdout, stderr); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return load()
}

// addSettings registers on fs the flags of the settings the command name
// reads, each defaulting to its variable's value (from getenv) where set, else
// to its default. A variable of another command is not looked at. Once fs
// has parsed its arguments, load parses every setting into a config and
// checks them (config.check).
// formerFlags are the former names of flags renamed after their variable,
// still taken: --relay is --relay-enabled (RELAY_ENABLED).
var formerFlags = map[string]string{"relay-enabled": "relay"}

func addSettings(fs *flag.FlagSet, name string, getenv func(string) string) (load func() (config, error)) {
	c := new(config)
	var read []setting
	values := map[string]*settingFlag{}
	cmd := commandNamed(name)
	for i, r := range c.rooms() {
		if !slices.Contains(cmd.rooms, r.name) {
			continue
		}
		for _, s := range r.settings {
			value := &settingFlag{text: s.def, typ: s.parse.typ, room: i, order: len(read), title: r.title}
			if v := getenv(s.env); v != "" {
				value.text = v
			}
			values[s.flag] = value
			read = append(read, s)
			fs.Var(value, s.flag, plainDoc(s.doc)+" ($"+s.env+")")
			if old, ok := formerFlags[s.flag]; ok {
				fs.Var(value, old, "the former name of --"+s.flag)
			}
		}
	}
	return func() (config, error) {
		fromFlag := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { fromFlag[f.Name] = true })
		source := func(env string) string {
			for _, s := range read {
				if s.env == env && fromFlag[s.flag] {
					return "--" + s.flag
				}
				if old, ok := formerFlags[s.flag]; ok && s.env == env && fromFlag[old] {
					return "--" + old
				}
			}
			return env
		}
		for _, s := range read {
			if err := s.parse.set(values[s.flag].text); err != nil {
				return config{}, fmt.Errorf("invalid %s: %w", source(s.env), err)
			}
		}
		reads := func(env string) bool { return slices.ContainsFunc(read, func(s setting) bool { return s.env == env }) }
		if err := c.check(reads, source); err != nil {
			return config{}, err
		}
		return *c, nil
	}
}

// Bounds on settings that would otherwise break the idempotency guarantee or
// starve the service. The settings' docs quote them (rooms.go), and so does
// docs/operations.md, generated from those.
const (
	// minKeyTTL: a key must outlive every retry of its request. Clients retry
	// for minutes (Stripe keeps keys 24 h), and a request lasts at most
	// seconds (maxKeyWait, the server's 30 s write timeout): an hour is
	// orders of magnitude beyond both.
	minKeyTTL = time.Hour
	// maxKeyWait: a waiting retry holds a connection and its HTTP request;
	// past 20 s it would outlast the server's 30 s write timeout together
	// with its own work, and the client would get a cut connection, not 409.
	maxKeyWait = 20 * time.Second
	// minKeyWait: PostgreSQL's lock_timeout is whole milliseconds, and 0
	// means no bound at all.
	minKeyWait = time.Millisecond
	// minJanitorInterval: a sweep is a database transaction; more often is a
	// busy loop. maxJanitorBatch: one batch is one DELETE holding its rows'
	// locks; larger ones stall live traffic.
	// minCommitWait: a synchronous standby on a healthy network confirms a
	// commit in a millisecond or two; a bound near that would turn every
	// commit into a 503. The cap is maxKeyWait's, for the same reason.
	minCommitWait      = 100 * time.Millisecond
	minJanitorInterval = time.Second
	maxJanitorBatch    = 100_000
	// minAuthorizationTTL, maxAuthorizationTTL: card networks let an
	// authorization stand for days to about a month; below a second a hold
	// would lapse before its client could capture it.
	minAuthorizationTTL = time.Second
	maxAuthorizationTTL = 31 * 24 * time.Hour
)

// rule is a check on settings each valid alone: broken says whether their
// values break it, and format (with args) why, after the first variable's
// name, which it blames.
type rule struct {
	vars   []string
	broken bool
	format string
	args   []any
}

// check refuses values that are valid alone but break the guarantee, alone or
// together. It applies only the rules whose every variable the command reads
// (reads): a variable it does not read is no part of its configuration. name
// gives the variable (or flag) to blame.
func (c config) check(reads func(env string) bool, name func(env string) string) error {
	for _, r := range c.rules() {
		if r.broken && !slices.ContainsFunc(r.vars, func(v string) bool { return !reads(v) }) {
			return fmt.Errorf("invalid %s: "+r.format, append([]any{name(r.vars[0])}, r.args...)...)
		}
	}
	return nil
}

// rules are the checks, in the order they are applied.
func (c config) rules() []rule {
	ttl, wait, commit, p := c.Keys.TTL, c.Pool.KeyWait, c.Pool.CommitWait, c.Processor
	return []rule{
		{[]string{"IDEMPOTENCY_TTL"}, ttl < minKeyTTL,
			"%s is below the floor of %s: a key must outlive every retry of its request", []any{ttl, minKeyTTL}},
		// lock_timeout is set in whole milliseconds, and 0 means wait forever.
		{[]string{"IDEMPOTENCY_WAIT"}, wait < minKeyWait,
			"%s rounds to 0 ms, which PostgreSQL's lock_timeout takes as no bound at all; want at least 1ms", []any{wait}},
		{[]string{"IDEMPOTENCY_WAIT"}, wait > maxKeyWait,
			"%s is above the cap of %s: a waiting retry holds a connection and must answer 409 before the server's 30s write timeout", []any{wait, maxKeyWait}},
		{[]string{"COMMIT_WAIT"}, commit < minCommitWait,
			"%s is below the floor of %s: commits the standby confirms in time would answer 503", []any{commit, minCommitWait}},
		{[]string{"COMMIT_WAIT"}, commit > maxKeyWait,
			"%s is above the cap of %s: a commit holds a connection and its requests, which must answer before the server's 30s write timeout", []any{commit, maxKeyWait}},
		{[]string{"JANITOR_INTERVAL"}, c.Keys.JanitorInterval < minJanitorInterval,
			"%s is below %s: each sweep is a database transaction", []any{c.Keys.JanitorInterval, minJanitorInterval}},
		{[]string{"JANITOR_INTERVAL", "IDEMPOTENCY_TTL"}, c.Keys.JanitorInterval > ttl,
			"%s exceeds IDEMPOTENCY_TTL (%s): expired keys would pile up for longer than keys are kept", []any{c.Keys.JanitorInterval, ttl}},
		{[]string{"JANITOR_BATCH"}, c.Keys.JanitorBatch > maxJanitorBatch,
			"%d is above %d: one batch is one DELETE, and a larger one stalls live traffic", []any{c.Keys.JanitorBatch, maxJanitorBatch}},
		{[]string{"CHARGE_AUTHORIZATION_TTL"}, c.Charges.AuthorizationTTL < minAuthorizationTTL,
			"%s is below %s: a hold would lapse before its client could capture it", []any{c.Charges.AuthorizationTTL, minAuthorizationTTL}},
		// An authorization's expires_at counts from its transaction's start;
		// a wait for its locked account (IDEMPOTENCY_WAIT) and the standby's
		// confirmation (COMMIT_WAIT) may come between that and its answer,
		// which must never show it expired already.
		{[]string{"CHARGE_AUTHORIZATION_TTL", "IDEMPOTENCY_WAIT", "COMMIT_WAIT"}, c.Charges.AuthorizationTTL <= wait+commit+time.Second,
			"%s is not above IDEMPOTENCY_WAIT (%s), COMMIT_WAIT (%s) and 1s: an authorization could be answered already expired",
			[]any{c.Charges.AuthorizationTTL, wait, commit}},
		{[]string{"CHARGE_AUTHORIZATION_TTL"}, c.Charges.AuthorizationTTL > maxAuthorizationTTL,
			"%s is above %s (31 days): no card network lets an authorization stand longer", []any{c.Charges.AuthorizationTTL, maxAuthorizationTTL}},
		{[]string{"EVENT_RETENTION"}, c.Relay.EventRetention <= webhook.DefaultRetryFor,
			"%s is not above the %s webhook deliveries are retried for: an event could be pruned before its last delivery", []any{c.Relay.EventRetention, webhook.DefaultRetryFor}},
		{[]string{"PROCESSOR_WAIT"}, c.Processor.Wait > maxKeyWait,
			"%s is above the cap of %s: a card charge's request must answer 202 before the server's 30s write timeout", []any{c.Processor.Wait, maxKeyWait}},
		{[]string{"PROCESSOR_DECISION_DEADLINE", "PROCESSOR_TIMEOUT"}, c.Processor.DecisionDeadline <= c.Processor.Timeout,
			"%s is not above PROCESSOR_TIMEOUT (%s): an authorization whose answer was lost could never be sent again before the processor decides",
			[]any{c.Processor.DecisionDeadline, c.Processor.Timeout}},
		{[]string{"PROCESSOR", "PROCESSOR_URL"}, p.Kind == processorSimulator && p.URL == "",
			"simulator needs PROCESSOR_URL, the simulator's address", nil},
		{[]string{"PROCESSOR_URL", "PROCESSOR"}, p.URL != "" && p.Kind != "" && p.Kind != processorSimulator,
			"is the simulator's address, but PROCESSOR is %s (for Stripe, STRIPE_API_BASE says where its API is)", []any{p.Kind}},
		{[]string{"PROCESSOR", "STRIPE_API_KEY"}, p.Kind == processorStripe && p.Stripe.APIKey == "",
			"stripe needs STRIPE_API_KEY, the account's secret key", nil},
		{[]string{"STRIPE_API_KEY", "PROCESSOR"}, p.Stripe.APIKey != "" && p.Kind != processorStripe,
			"is set, but PROCESSOR is not stripe", nil},
		{[]string{"STRIPE_API_BASE", "PROCESSOR"}, p.Stripe.APIBase != "" && p.Kind != processorStripe,
			"is set, but PROCESSOR is not stripe", nil},
		{[]string{"STRIPE_ACCOUNT", "PROCESSOR"}, p.Stripe.Account != "" && p.Kind != processorStripe,
			"is set, but PROCESSOR is not stripe", nil},
		{[]string{"STRIPE_WEBHOOK_SECRET", "PROCESSOR"}, p.Stripe.WebhookSecret != "" && p.Kind != processorStripe,
			"is set, but PROCESSOR is not stripe", nil},
		{[]string{"PROCESSOR_WEBHOOK_SECRET", "PROCESSOR"}, p.WebhookSecret != "" && p.Kind == processorStripe,
			"is the simulator's; with PROCESSOR=stripe, STRIPE_WEBHOOK_SECRET verifies Stripe's webhooks", nil},
		{[]string{"CHARGE_BATCHES", "DB_MAX_CONNS"}, c.Charges.Batches >= int(c.Pool.MaxConns),
			"%d leaves no connection of DB_MAX_CONNS (%d) for other requests: each charge batch holds one; want fewer than DB_MAX_CONNS", []any{c.Charges.Batches, c.Pool.MaxConns}},
	}
}
