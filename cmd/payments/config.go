package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/payments/internal/webhook"
)

// config is the service's configuration: environment variables, each
// overridable by a flag.
type config struct {
	DatabaseURL      string
	HTTPAddr         string
	IdempotencyTTL   time.Duration
	IdempotencyWait  time.Duration
	CommitWait       time.Duration
	DBMaxConns       int32
	ShutdownTimeout  time.Duration
	ShutdownDelay    time.Duration
	TrustedProxies   []netip.Prefix
	LogLevel         slog.Level
	NATSURL          string
	RelayEnabled     bool
	RelayBatch       int
	ChargeBatchSize  int
	PprofAddr        string
	MetricsAddr      string
	MetricsSample    time.Duration
	EventsHeldWarn   time.Duration
	ChargeBatches    int
	RelayPoll        time.Duration
	EventRetention   time.Duration
	CacheSize        int
	CacheBytes       int64
	JanitorInterval  time.Duration
	JanitorBatch     int
	MigrateWait      time.Duration
	AuthorizationTTL time.Duration
	ExpiryInterval   time.Duration
	// WebhookAllowPrivate lets webhook endpoints have http URLs and local
	// addresses: development and tests only.
	WebhookAllowPrivate bool
	// WebhookDelivery: serve delivers webhooks (every replica that does
	// shares the work).
	WebhookDelivery bool
}

// setting is one configuration value: its variable, flag, default and parser.
type setting struct {
	env, flag, def, usage string
	parse                 parser
}

// parser reads a setting's text into the config; typ names what it reads,
// for -h: duration, size, int, bool, ...
type parser struct {
	typ string
	set func(string) error
}

func (c *config) settings() []setting {
	return []setting{
		{"DATABASE_URL", "database-url", "postgres://postgres@localhost:5432/payments?sslmode=disable",
			"PostgreSQL connection URL", parser{"url", func(v string) error { c.DatabaseURL = v; return nonEmpty(v) }}},
		{"HTTP_ADDR", "http-addr", ":8080", "address the HTTP API listens on",
			parser{"address", func(v string) error { c.HTTPAddr = v; return nonEmpty(v) }}},
		{"IDEMPOTENCY_TTL", "idempotency-ttl", "24h", "how long idempotency keys and their responses are kept",
			durationInto(&c.IdempotencyTTL)},
		{"IDEMPOTENCY_WAIT", "idempotency-wait", "5s", "how long a request waits behind an in-flight request with the same key before 409",
			durationInto(&c.IdempotencyWait)},
		{"COMMIT_WAIT", "commit-wait", "5s", "how long a commit may wait for the synchronous standby before the request answers 503 instead of success",
			durationInto(&c.CommitWait)},
		{"IDEMPOTENCY_CACHE_SIZE", "idempotency-cache-size", "10000", "completed responses kept in memory for fast replays (0 disables)",
			wholeNumber(&c.CacheSize)},
		{"IDEMPOTENCY_CACHE_BYTES", "idempotency-cache-bytes", "64MiB", "most memory the replay cache holds, in bytes (KiB, MiB, GiB suffixes; 0 disables)",
			sizeInto(&c.CacheBytes)},
		{"JANITOR_INTERVAL", "janitor-interval", "1m", "how often expired idempotency keys are deleted",
			durationInto(&c.JanitorInterval)},
		{"JANITOR_BATCH", "janitor-batch", "1000", "most expired keys deleted per transaction",
			positiveInt(&c.JanitorBatch)},
		{"DB_MAX_CONNS", "db-max-conns", "20", "maximum PostgreSQL connections in the pool",
			parser{"int", func(v string) error {
				var n int
				if err := positiveInt(&n).set(v); err != nil {
					return err
				}
				c.DBMaxConns = int32(min(n, 10_000))
				return nil
			}}},
		{"CHARGE_BATCH_SIZE", "charge-batch-size", "64", "most concurrent charges committed together in one transaction (group commit)",
			positiveInt(&c.ChargeBatchSize)},
		{"CHARGE_AUTHORIZATION_TTL", "charge-authorization-ttl", "168h", "how long an authorization (a charge created with capture: false) holds its amount unless captured or voided; from 1s to 744h (31 days)",
			durationInto(&c.AuthorizationTTL)},
		{"CHARGE_EXPIRY_INTERVAL", "charge-expiry-interval", "30s", "how often expired authorizations are recorded as expired, with their charge.expired events (reads show them expired at once regardless); at least 1s",
			durationAtLeast(&c.ExpiryInterval, time.Second)},
		{"CHARGE_BATCHES", "charge-batches", "1", "charge batches in flight at once; a charge waits for company only while all are busy",
			positiveInt(&c.ChargeBatches)},
		{"PPROF_ADDR", "pprof-addr", "", "address of a listener serving Go's profiler (/debug/pprof/) for performance work; empty: none. Keep it on loopback",
			parser{"address", func(v string) error { c.PprofAddr = v; return nil }}},
		{"METRICS_ADDR", "metrics-addr", "127.0.0.1:9464", "address of the listener serving Prometheus metrics (/metrics); off: none",
			parser{"address", func(v string) error {
				// An empty variable means the default, as for every setting.
				if v == "off" {
					v = ""
				}
				c.MetricsAddr = v
				return nil
			}}},
		{"METRICS_SAMPLE", "metrics-sample", "15s", "how often the outbox is sampled for its gauges and the EVENTS_HELD_WARN warning; at least 1s",
			durationAtLeast(&c.MetricsSample, time.Second)},
		{"EVENTS_HELD_WARN", "events-held-warn", "30s", "log a warning naming the transaction that holds events back (the event horizon) once an event has waited this long; sampled every METRICS_SAMPLE",
			durationInto(&c.EventsHeldWarn)},
		{"SHUTDOWN_DELAY", "shutdown-delay", "5s", "after SIGTERM, how long every request is still served while /readyz answers 503, so that load balancers stop sending traffic before the listener closes; 0 disables",
			durationOrZero(&c.ShutdownDelay)},
		{"SHUTDOWN_TIMEOUT", "shutdown-timeout", "15s", "how long in-flight requests may finish once the listener has closed (after SHUTDOWN_DELAY)",
			durationInto(&c.ShutdownTimeout)},
		{"TRUSTED_PROXIES", "trusted-proxies", "", "comma-separated addresses or CIDRs of the proxies whose X-Forwarded-For names the client, for the budget of unknown API keys; empty: none, the header is ignored",
			parser{"cidrs", func(v string) (err error) { c.TrustedProxies, err = parsePrefixes(v); return err }}},
		{"LOG_LEVEL", "log-level", "info", "debug, info, warn or error",
			parser{"level", func(v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }}},
		{"NATS_URL", "nats-url", "nats://127.0.0.1:4222", "NATS server (with JetStream) the relay publishes events to",
			parser{"url", func(v string) error { c.NATSURL = v; return nonEmpty(v) }}},
		{"RELAY_ENABLED", "relay", "true", "whether serve also runs the outbox relay (one replica leads at a time)",
			boolInto(&c.RelayEnabled)},
		{"RELAY_BATCH", "relay-batch", "100", "most events the relay publishes per round",
			positiveInt(&c.RelayBatch)},
		{"RELAY_POLL", "relay-poll", "1s", "how often the relay looks for events without a notification",
			durationInto(&c.RelayPoll)},
		{"EVENT_RETENTION", "event-retention", "720h", "how long published events stay in the outbox (and the /v1/events feed), and webhook attempts and settled deliveries in their record",
			durationInto(&c.EventRetention)},
		{"WEBHOOK_ALLOW_PRIVATE_NETWORKS", "webhook-allow-private-networks", "false", "allow webhook endpoints with http URLs and loopback, private or link-local addresses, for development and tests only: it lets API callers make the service send requests inside its network (logged at WARN at start)",
			boolInto(&c.WebhookAllowPrivate)},
		{"WEBHOOK_DELIVERY", "webhook-delivery", "true", "whether serve delivers webhooks to merchants' endpoints; the replicas that do share the work (one fans events out at a time, deliveries are leased)",
			boolInto(&c.WebhookDelivery)},
		{"MIGRATE_WAIT", "migrate-wait", "60s", "how long migrate up waits for PostgreSQL to accept connections",
			durationInto(&c.MigrateWait)},
	}
}

// loadConfig reads the environment, then the flags in args, of the command
// name ("serve", "migrate up"). A bad value is an error naming the variable or
// flag it came from. -h prints the settings to stdout (parseFlags).
func loadConfig(name string, args []string, getenv func(string) string, stdout, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	settings := c.settings()
	values := make(map[string]*settingFlag, len(settings))
	for _, s := range settings {
		value := &settingFlag{text: s.def, typ: s.parse.typ}
		if v := getenv(s.env); v != "" {
			value.text = v
		}
		values[s.flag] = value
		fs.Var(value, s.flag, s.usage+" ($"+s.env+")")
	}
	usage := "usage: payments " + name + " [flags]\n\nEach flag overrides its environment variable, named at its end:"
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	fromFlag := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { fromFlag[f.Name] = true })
	for _, s := range settings {
		if err := s.parse.set(values[s.flag].text); err != nil {
			source := s.env
			if fromFlag[s.flag] {
				source = "--" + s.flag
			}
			return config{}, fmt.Errorf("invalid %s: %w", source, err)
		}
	}
	source := func(env string) string {
		for _, s := range settings {
			if s.env == env && fromFlag[s.flag] {
				return "--" + s.flag
			}
		}
		return env
	}
	if err := c.check(source); err != nil {
		return config{}, err
	}
	return c, nil
}

// Bounds on settings that would otherwise break the idempotency guarantee or
// starve the service. README's configuration table repeats them.
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

// check refuses values that are valid alone but break the guarantee, alone or
// together. name gives the variable (or flag) to blame.
func (c config) check(name func(env string) string) error {
	fail := func(env, format string, args ...any) error {
		return fmt.Errorf("invalid %s: "+format, append([]any{name(env)}, args...)...)
	}
	switch {
	case c.IdempotencyTTL < minKeyTTL:
		return fail("IDEMPOTENCY_TTL", "%s is below the floor of %s: a key must outlive every retry of its request", c.IdempotencyTTL, minKeyTTL)
	case c.IdempotencyWait < time.Millisecond:
		// lock_timeout is set in whole milliseconds, and 0 means wait forever.
		return fail("IDEMPOTENCY_WAIT", "%s rounds to 0 ms, which PostgreSQL's lock_timeout takes as no bound at all; want at least 1ms", c.IdempotencyWait)
	case c.IdempotencyWait > maxKeyWait:
		return fail("IDEMPOTENCY_WAIT", "%s is above the cap of %s: a waiting retry holds a connection and must answer 409 before the server's 30s write timeout", c.IdempotencyWait, maxKeyWait)
	case c.CommitWait < minCommitWait:
		return fail("COMMIT_WAIT", "%s is below the floor of %s: commits the standby confirms in time would answer 503", c.CommitWait, minCommitWait)
	case c.CommitWait > maxKeyWait:
		return fail("COMMIT_WAIT", "%s is above the cap of %s: a commit holds a connection and its requests, which must answer before the server's 30s write timeout", c.CommitWait, maxKeyWait)
	case c.JanitorInterval < minJanitorInterval:
		return fail("JANITOR_INTERVAL", "%s is below %s: each sweep is a database transaction", c.JanitorInterval, minJanitorInterval)
	case c.JanitorInterval > c.IdempotencyTTL:
		return fail("JANITOR_INTERVAL", "%s exceeds IDEMPOTENCY_TTL (%s): expired keys would pile up for longer than keys are kept", c.JanitorInterval, c.IdempotencyTTL)
	case c.JanitorBatch > maxJanitorBatch:
		return fail("JANITOR_BATCH", "%d is above %d: one batch is one DELETE, and a larger one stalls live traffic", c.JanitorBatch, maxJanitorBatch)
	case c.AuthorizationTTL < minAuthorizationTTL:
		return fail("CHARGE_AUTHORIZATION_TTL", "%s is below %s: a hold would lapse before its client could capture it", c.AuthorizationTTL, minAuthorizationTTL)
	case c.AuthorizationTTL > maxAuthorizationTTL:
		return fail("CHARGE_AUTHORIZATION_TTL", "%s is above %s (31 days): no card network lets an authorization stand longer", c.AuthorizationTTL, maxAuthorizationTTL)
	case c.EventRetention <= webhook.DefaultRetryFor:
		return fail("EVENT_RETENTION", "%s is not above the %s webhook deliveries are retried for: an event could be pruned before its last delivery", c.EventRetention, webhook.DefaultRetryFor)
	case c.ChargeBatches >= int(c.DBMaxConns):
		return fail("CHARGE_BATCHES", "%d leaves no connection of DB_MAX_CONNS (%d) for other requests: each charge batch holds one; want fewer than DB_MAX_CONNS", c.ChargeBatches, c.DBMaxConns)
	}
	return nil
}

func nonEmpty(v string) error {
	if v == "" {
		return fmt.Errorf("must not be empty")
	}
	return nil
}

// wholeNumber parses an integer of 0 or more into n.
func wholeNumber(n *int) parser { return intAtLeast(n, 0, "a whole number") }

// positiveInt parses an integer of 1 or more into n.
func positiveInt(n *int) parser { return intAtLeast(n, 1, "a positive integer") }

// intAtLeast parses an integer of floor or more into n; want names such a
// number in the error.
func intAtLeast(n *int, floor int, want string) parser {
	return parser{"int", func(v string) error {
		parsed, err := strconv.Atoi(v)
		if err != nil || parsed < floor {
			return fmt.Errorf("want %s, got %q", want, v)
		}
		*n = parsed
		return nil
	}}
}

// sizeInto parses a size in bytes (parseBytes) into n.
func sizeInto(n *int64) parser {
	return parser{"size", func(v string) (err error) {
		*n, err = parseBytes(v)
		return err
	}}
}

// parseBytes reads a size such as 1048576, 512KiB, 64MiB or 1GiB.
func parseBytes(v string) (int64, error) {
	digits, unit := v, int64(1)
	for suffix, size := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if d, ok := strings.CutSuffix(v, suffix); ok {
			digits, unit = d, size
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/unit {
		return 0, fmt.Errorf("want a size in bytes such as 67108864 or 64MiB (at most 1TiB), got %q", v)
	}
	return n * unit, nil
}

// durationInto parses a positive duration into d.
func durationInto(d *time.Duration) parser {
	return parser{"duration", func(v string) error {
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed <= 0 {
			return fmt.Errorf("want a positive duration such as 5s or 24h, got %q", v)
		}
		*d = parsed
		return nil
	}}
}

// durationOrZero parses a duration of 0 or more into d.
func durationOrZero(d *time.Duration) parser {
	return parser{"duration", func(v string) error {
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed < 0 {
			return fmt.Errorf("want a duration such as 5s, or 0 for none, got %q", v)
		}
		*d = parsed
		return nil
	}}
}

// parsePrefixes reads a comma-separated list of CIDRs (10.0.0.0/8,
// fd00::/8) or single addresses (192.0.2.7); empty is none.
func parsePrefixes(v string) ([]netip.Prefix, error) {
	var prefixes []netip.Prefix
	for _, field := range strings.Split(v, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		p, err := netip.ParsePrefix(field)
		if err != nil {
			addr, addrErr := netip.ParseAddr(field)
			if addrErr != nil {
				return nil, fmt.Errorf("want addresses or CIDRs such as 10.0.0.0/8,192.0.2.7, got %q", field)
			}
			p = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		}
		prefixes = append(prefixes, p.Masked())
	}
	return prefixes, nil
}

// durationAtLeast parses a duration of at least floor into d.
func durationAtLeast(d *time.Duration, floor time.Duration) parser {
	return parser{"duration", func(v string) error {
		if err := durationInto(d).set(v); err != nil {
			return err
		}
		if *d < floor {
			return fmt.Errorf("want at least %s, got %q", floor, v)
		}
		return nil
	}}
}

// boolInto parses a boolean into b, as strconv.ParseBool reads it: true,
// false, 1, 0 and their other spellings. Its flag takes the value as every
// setting's does (--relay false), not alone.
func boolInto(b *bool) parser {
	return parser{"bool", func(v string) (err error) {
		*b, err = strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		return nil
	}}
}
