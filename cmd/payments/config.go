package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"
)

// config is the service's configuration: environment variables, each
// overridable by a flag.
type config struct {
	DatabaseURL     string
	HTTPAddr        string
	IdempotencyTTL  time.Duration
	IdempotencyWait time.Duration
	DBMaxConns      int32
	ShutdownTimeout time.Duration
	LogLevel        slog.Level
	NATSURL         string
	RelayEnabled    bool
	RelayBatch      int
	ChargeBatchSize int
	PprofAddr       string
	MetricsAddr     string
	MetricsSample   time.Duration
	ChargeBatches   int
	RelayPoll       time.Duration
	EventRetention  time.Duration
	CacheSize       int
	JanitorInterval time.Duration
	JanitorBatch    int
	MigrateWait     time.Duration
}

// setting is one configuration value: its variable, flag, default and parser.
type setting struct {
	env, flag, def, usage string
	parse                 func(string) error
}

func (c *config) settings() []setting {
	return []setting{
		{"DATABASE_URL", "database-url", "postgres://postgres@localhost:5432/payments?sslmode=disable",
			"PostgreSQL connection URL", func(v string) error { c.DatabaseURL = v; return nonEmpty(v) }},
		{"HTTP_ADDR", "http-addr", ":8080", "address the HTTP API listens on",
			func(v string) error { c.HTTPAddr = v; return nonEmpty(v) }},
		{"IDEMPOTENCY_TTL", "idempotency-ttl", "24h", "how long idempotency keys and their responses are kept",
			durationInto(&c.IdempotencyTTL)},
		{"IDEMPOTENCY_WAIT", "idempotency-wait", "5s", "how long a request waits behind an in-flight request with the same key before 409",
			durationInto(&c.IdempotencyWait)},
		{"IDEMPOTENCY_CACHE_SIZE", "idempotency-cache-size", "10000", "completed responses kept in memory for fast replays (0 disables)",
			func(v string) error {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return fmt.Errorf("want a whole number, got %q", v)
				}
				c.CacheSize = n
				return nil
			}},
		{"JANITOR_INTERVAL", "janitor-interval", "1m", "how often expired idempotency keys are deleted",
			durationInto(&c.JanitorInterval)},
		{"JANITOR_BATCH", "janitor-batch", "1000", "most expired keys deleted per transaction",
			positiveInt(&c.JanitorBatch)},
		{"DB_MAX_CONNS", "db-max-conns", "20", "maximum PostgreSQL connections in the pool",
			func(v string) error {
				var n int
				if err := positiveInt(&n)(v); err != nil {
					return err
				}
				c.DBMaxConns = int32(min(n, 10_000))
				return nil
			}},
		{"CHARGE_BATCH_SIZE", "charge-batch-size", "64", "most concurrent charges committed together in one transaction (group commit)",
			positiveInt(&c.ChargeBatchSize)},
		{"CHARGE_BATCHES", "charge-batches", "1", "charge batches in flight at once; a charge waits for company only while all are busy",
			positiveInt(&c.ChargeBatches)},
		{"PPROF_ADDR", "pprof-addr", "", "address of a listener serving Go's profiler (/debug/pprof/) for performance work; empty: none. Keep it on loopback",
			func(v string) error { c.PprofAddr = v; return nil }},
		{"METRICS_ADDR", "metrics-addr", "127.0.0.1:9464", "address of the listener serving Prometheus metrics (/metrics); off: none",
			func(v string) error {
				// An empty variable means the default, as for every setting.
				if v == "off" {
					v = ""
				}
				c.MetricsAddr = v
				return nil
			}},
		{"METRICS_SAMPLE", "metrics-sample", "15s", "how often gauges that need the database (the outbox backlog) are sampled; at least 1s",
			func(v string) error {
				if err := durationInto(&c.MetricsSample)(v); err != nil {
					return err
				}
				if c.MetricsSample < time.Second {
					return fmt.Errorf("want at least 1s, got %q", v)
				}
				return nil
			}},
		{"SHUTDOWN_TIMEOUT", "shutdown-timeout", "15s", "how long in-flight requests may finish after SIGTERM",
			durationInto(&c.ShutdownTimeout)},
		{"LOG_LEVEL", "log-level", "info", "debug, info, warn or error",
			func(v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
		{"NATS_URL", "nats-url", "nats://127.0.0.1:4222", "NATS server (with JetStream) the relay publishes events to",
			func(v string) error { c.NATSURL = v; return nonEmpty(v) }},
		{"RELAY_ENABLED", "relay", "true", "whether serve also runs the outbox relay (one replica leads at a time)",
			func(v string) (err error) {
				c.RelayEnabled, err = strconv.ParseBool(v)
				if err != nil {
					return fmt.Errorf("want true or false, got %q", v)
				}
				return nil
			}},
		{"RELAY_BATCH", "relay-batch", "100", "most events the relay publishes per round",
			positiveInt(&c.RelayBatch)},
		{"RELAY_POLL", "relay-poll", "1s", "how often the relay looks for events without a notification",
			durationInto(&c.RelayPoll)},
		{"EVENT_RETENTION", "event-retention", "720h", "how long published events stay in the outbox (and the /v1/events feed)",
			durationInto(&c.EventRetention)},
		{"MIGRATE_WAIT", "migrate-wait", "60s", "how long migrate up waits for PostgreSQL to accept connections",
			durationInto(&c.MigrateWait)},
	}
}

// loadConfig reads the environment, then the flags in args. A bad value is an
// error naming the variable or flag it came from.
func loadConfig(name string, args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	settings := c.settings()
	values := make(map[string]*string, len(settings))
	for _, s := range settings {
		def := s.def
		if v := getenv(s.env); v != "" {
			def = v
		}
		values[s.flag] = fs.String(s.flag, def, s.usage+" ($"+s.env+")")
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	fromFlag := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { fromFlag[f.Name] = true })
	for _, s := range settings {
		if err := s.parse(*values[s.flag]); err != nil {
			source := s.env
			if fromFlag[s.flag] {
				source = "--" + s.flag
			}
			return config{}, fmt.Errorf("invalid %s: %w", source, err)
		}
	}
	return c, nil
}

func nonEmpty(v string) error {
	if v == "" {
		return fmt.Errorf("must not be empty")
	}
	return nil
}

func positiveInt(n *int) func(string) error {
	return func(v string) error {
		parsed, err := strconv.Atoi(v)
		if err != nil || parsed < 1 {
			return fmt.Errorf("want a positive integer, got %q", v)
		}
		*n = parsed
		return nil
	}
}

func durationInto(d *time.Duration) func(string) error {
	return func(v string) error {
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed <= 0 {
			return fmt.Errorf("want a positive duration such as 5s or 24h, got %q", v)
		}
		*d = parsed
		return nil
	}
}
