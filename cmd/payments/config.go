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
		{"DB_MAX_CONNS", "db-max-conns", "20", "maximum PostgreSQL connections in the pool",
			func(v string) error {
				n, err := strconv.ParseInt(v, 10, 32)
				if err != nil || n < 1 {
					return fmt.Errorf("want a positive integer, got %q", v)
				}
				c.DBMaxConns = int32(n)
				return nil
			}},
		{"SHUTDOWN_TIMEOUT", "shutdown-timeout", "15s", "how long in-flight requests may finish after SIGTERM",
			durationInto(&c.ShutdownTimeout)},
		{"LOG_LEVEL", "log-level", "info", "debug, info, warn or error",
			func(v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
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
