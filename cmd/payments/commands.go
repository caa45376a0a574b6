package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"payments"
	"payments/internal/httpapi"
	"payments/internal/idempotency"
	"payments/internal/metrics"
	"payments/internal/postgres"
	"payments/migrations"
)

// maxHeaderBytes bounds a request's headers; net/http answers 431 past it.
const maxHeaderBytes = 16 << 10

// serve runs the HTTP API until ctx is cancelled, then drains in-flight
// requests for up to ShutdownTimeout.
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	m := metrics.New()
	cfg, log, store, err := open(ctx, "serve", args, getenv, stderr, m)
	if err != nil {
		return err
	}
	defer store.Close()
	m.Pool(store.Pool())
	m.ChargeBatcher(store.ChargeStats, store.StuckAfter())
	front := idempotency.NewFront(cfg.CacheSize, cfg.CacheBytes, cfg.IdempotencyTTL, cfg.IdempotencyWait)
	m.CounterFunc("payments_idempotency_cache_hits_total", "Replays answered from the in-memory cache.",
		func() float64 { h, _ := front.Cache().Stats(); return float64(h) })
	m.GaugeFunc("payments_idempotency_cache_entries", "Completed responses held in the cache.",
		func() float64 { return float64(front.Cache().Len()) })
	m.GaugeFunc("payments_idempotency_cache_bytes", "Bytes the cached responses are counted for (IDEMPOTENCY_CACHE_BYTES bounds them).",
		func() float64 { return float64(front.Cache().Bytes()) })
	m.GaugeFunc("payments_idempotency_cache_max_bytes", "The cache's byte bound, IDEMPOTENCY_CACHE_BYTES.",
		func() float64 { return float64(cfg.CacheBytes) })
	m.GaugeFunc("payments_idempotency_cache_max_entries", "The cache's bound (IDEMPOTENCY_CACHE_SIZE).",
		func() float64 { return float64(cfg.CacheSize) })
	m.GaugeFunc("payments_idempotency_keys_in_flight", "Keys executing in this process (coalescing leaders).",
		func() float64 { return float64(front.InFlight()) })
	if err := store.Ping(ctx); err != nil {
		// Start anyway: /readyz reports the database, and requests answer 503
		// until it is back.
		log.Warn("database not reachable at start", "error", err)
	}

	api := httpapi.New(store, log, httpapi.Options{
		Spec:    payments.OpenAPI,
		Docs:    true,
		Front:   front,
		Metrics: m,
	})
	janitor := idempotency.NewJanitor(store, log, cfg.IdempotencyTTL, cfg.JanitorInterval, cfg.JanitorBatch, 10*time.Millisecond)
	m.CounterFunc("payments_janitor_deleted_keys_total", "Expired idempotency keys deleted by this process's janitor.",
		func() float64 { return float64(janitor.Deleted()) })
	m.GaugeFunc("payments_janitor_caught_up_timestamp_seconds", "When this process's janitor last left no expired key (0: never; a janitor standing aside for another never does).",
		func() float64 {
			if at := janitor.CaughtUp(); !at.IsZero() {
				return float64(at.Unix())
			}
			return 0
		})
	janitorCtx, stopJanitor := context.WithCancel(context.WithoutCancel(ctx))
	janitorDone := make(chan struct{})
	go func() { defer close(janitorDone); janitor.Run(janitorCtx) }()
	defer func() { stopJanitor(); <-janitorDone }()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	defer ln.Close() // in case serving never starts; Shutdown closes it too
	srv := &http.Server{
		Handler:           api,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("listening", "addr", ln.Addr().String())
	if cfg.MetricsAddr != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsAddr, m.Handler(), log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	// The outbox is sampled in the background on a connection of its own, for
	// the gauges and the warning about held events: a scrape does no database
	// work, and sampling takes no connection from payments.
	monitor, err := postgres.OpenMonitor(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	defer monitor.Close()
	sampler := m.Backlog(outboxSampler(monitor, cfg.EventsHeldWarn, log))
	samplerCtx, stopSampler := context.WithCancel(context.WithoutCancel(ctx))
	samplerDone := make(chan struct{})
	go func() { defer close(samplerDone); sampler.Run(samplerCtx, cfg.MetricsSample) }()
	defer func() { stopSampler(); <-samplerDone }()
	if cfg.PprofAddr != "" {
		stopPprof, err := servePprof(cfg.PprofAddr, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}

	if cfg.RelayEnabled {
		r, nc, err := newRelay(cfg, store, log)
		if err != nil {
			return err
		}
		defer nc.Close()
		m.CounterFunc("payments_relay_published_total", "Events the broker stored.", func() float64 { return float64(r.Stats.Published.Load()) })
		m.CounterFunc("payments_relay_duplicates_total", "Republished events the broker recognised.", func() float64 { return float64(r.Stats.Duplicates.Load()) })
		m.CounterFunc("payments_relay_pruned_total", "Published events pruned after the retention.", func() float64 { return float64(r.Stats.Pruned.Load()) })
		m.GaugeFunc("payments_relay_leader", "1 while this process's relay leads.", func() float64 {
			if r.Stats.Leader.Load() {
				return 1
			}
			return 0
		})
		relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
		relayDone := make(chan error, 1)
		go func() { relayDone <- r.Run(relayCtx) }()
		// Stop the relay after the HTTP server has drained: deferred calls
		// run in reverse order, after the shutdown below.
		defer func() {
			stopRelay()
			if err := <-relayDone; err != nil {
				log.Error("relay stopped", "error", err)
			}
		}()
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}

// migrate applies, reverts or reports the schema. "up" first waits up to
// MIGRATE_WAIT for PostgreSQL to accept connections, as it may still be
// starting next to the service (docker compose up).
func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: payments migrate up|down|version [--database-url URL] [--migrate-wait 60s]")
	}
	cfg, err := loadConfig("migrate "+args[0], args[1:], getenv, stderr)
	if err != nil {
		return err
	}
	switch args[0] {
	case "up":
		if err := waitForDatabase(ctx, cfg.DatabaseURL, cfg.MigrateWait, stderr); err != nil {
			return err
		}
		if err := migrations.Up(cfg.DatabaseURL); err != nil {
			return err
		}
	case "down":
		if err := migrations.Down(cfg.DatabaseURL); err != nil {
			return err
		}
	case "version":
	default:
		return fmt.Errorf("unknown migrate command %q: want up, down or version", args[0])
	}
	version, dirty, err := migrations.Version(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "schema version %d (dirty: %t)\n", version, dirty)
	return err
}

// retryInterval is the pause between two attempts of waitForDatabase.
const retryInterval = time.Second

// waitForDatabase runs ensureDatabase until it succeeds, fails in a way that
// waiting cannot fix (a wrong password, an SQL error), or wait has passed. Each
// wait prints one line naming the server and the cause.
func waitForDatabase(ctx context.Context, databaseURL string, wait time.Duration, stderr io.Writer) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	server := net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	deadline := time.Now().Add(wait)
	for {
		err := ensureDatabase(ctx, databaseURL, stderr)
		if err == nil || !notYetReachable(ctx, err) {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("PostgreSQL at %s did not accept connections within %s (MIGRATE_WAIT): %w", server, wait, err)
		}
		fmt.Fprintf(stderr, "waiting for PostgreSQL at %s: %s\n", server, connectCause(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for PostgreSQL at %s: %w", server, ctx.Err())
		case <-time.After(min(retryInterval, left)):
		}
	}
}

// notYetReachable reports whether err is a server that is not there yet: its
// port refuses or times out, its name does not resolve yet (a container still
// starting), or it answers that it is starting up (SQLSTATE 57P03).
func notYetReachable(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P03" // cannot_connect_now
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) ||
		errors.As(err, &opErr) && opErr.Op == "dial" ||
		errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
}

// connectCause is the innermost part of a connection error worth a line:
// "connect: connection refused", not the driver's whole account.
func connectCause(err error) string {
	var pgErr *pgconn.PgError
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	case errors.As(err, &dnsErr):
		return dnsErr.Error()
	case errors.As(err, &opErr) && opErr.Err != nil:
		return opErr.Err.Error()
	}
	return err.Error()
}

// ensureDatabase creates the database named in databaseURL when the server
// reports it does not exist, so a newcomer needs no psql to get started.
func ensureDatabase(ctx context.Context, databaseURL string, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		// A host that drops packets costs one attempt 5 s, not the whole wait.
		cfg.ConnectTimeout = 5 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	name := cfg.Database
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database %q does not exist, and connecting to database postgres to create it failed: %w", name, err)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" "+migrations.CreateDatabaseOptions)
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		// Created meanwhile, by another replica migrating at the same time,
		// or already there but not yet replayed on the standby that a
		// multi-host URL tried first (pgx stops at its "does not exist").
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	fmt.Fprintf(stderr, "created database %q\n", name)
	return nil
}

// merchants registers a merchant and prints its id, its API key and the key's id as JSON.
func merchants(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: payments merchants create --name NAME")
	}
	fs := flag.NewFlagSet("merchants create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "the merchant's name (required)")
	dbURL := fs.String("database-url", "", "PostgreSQL connection URL ($DATABASE_URL)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if strings.TrimSpace(*name) == "" {
		return errors.New("merchants create: --name is required")
	}
	store, err := openAdmin(ctx, "merchants create", *dbURL, getenv, stderr)
	if err != nil {
		return err
	}
	defer store.Close()
	id, key, err := store.RegisterMerchant(ctx, *name)
	if err != nil {
		return fmt.Errorf("create merchant: %w", err)
	}
	return json.NewEncoder(stdout).Encode(map[string]string{"merchant_id": id.String(), "key_id": key.ID, "api_key": key.Secret})
}

const keyCommandsUsage = `usage:
  payments api-keys create --merchant ID   give the merchant a new API key; prints it once
  payments api-keys list --merchant ID     the merchant's keys: ids, creation, last use, revocation
  payments api-keys revoke KEY_ID          refuse the key from now on (every replica within 2 s)`

// apiKeys creates, lists and revokes merchants' API keys. It prints JSON; the
// secret only once, on creation.
func apiKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(keyCommandsUsage)
	}
	cmd := "api-keys " + args[0]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL connection URL ($DATABASE_URL)")
	var merchantFlag *string
	switch args[0] {
	case "create", "list":
		merchantFlag = fs.String("merchant", "", "the merchant's id (required)")
	case "revoke":
	default:
		return fmt.Errorf("unknown api-keys command %q\n%s", args[0], keyCommandsUsage)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	// revoke takes one KEY_ID, before or after the flags.
	var keyID string
	if merchantFlag == nil {
		if fs.NArg() == 0 {
			return fmt.Errorf("%s: name the key to revoke: payments api-keys revoke KEY_ID", cmd)
		}
		keyID = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q\n%s", cmd, fs.Arg(0), keyCommandsUsage)
	}
	var merchant uuid.UUID
	if merchantFlag != nil {
		if *merchantFlag == "" {
			return fmt.Errorf("%s: --merchant is required", cmd)
		}
		var err error
		if merchant, err = uuid.Parse(*merchantFlag); err != nil {
			return fmt.Errorf("%s: unknown merchant %q: a merchant id is a UUID", cmd, *merchantFlag)
		}
	}
	store, err := openAdmin(ctx, cmd, *dbURL, getenv, stderr)
	if err != nil {
		return err
	}
	defer store.Close()
	enc := json.NewEncoder(stdout)
	switch args[0] {
	case "create":
		key, err := store.CreateAPIKey(ctx, merchant)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		return enc.Encode(map[string]string{"key_id": key.ID, "api_key": key.Secret})
	case "list":
		keys, err := store.ListAPIKeys(ctx, merchant)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		listed := make([]listedKey, len(keys))
		for i, k := range keys {
			listed[i] = listedKeyOf(k)
		}
		return enc.Encode(struct {
			MerchantID string      `json:"merchant_id"`
			APIKeys    []listedKey `json:"api_keys"`
		}{merchant.String(), listed})
	default:
		k, err := store.RevokeAPIKey(ctx, keyID)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		return enc.Encode(listedKeyOf(k))
	}
}

// listedKey is how api-keys prints a key: never its secret or hash.
type listedKey struct {
	KeyID      string     `json:"key_id"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

func listedKeyOf(k postgres.APIKey) listedKey {
	utc := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		u := t.UTC()
		return &u
	}
	return listedKey{KeyID: k.ID, CreatedAt: k.CreatedAt.UTC(), LastUsedAt: utc(k.LastUsedAt), RevokedAt: utc(k.RevokedAt)}
}

// openAdmin opens a one-connection store for an operator command; dbURL, if
// set, overrides DATABASE_URL.
func openAdmin(ctx context.Context, cmd, dbURL string, getenv func(string) string, stderr io.Writer) (*postgres.Store, error) {
	var cfgArgs []string
	if dbURL != "" {
		cfgArgs = []string{"--database-url", dbURL}
	}
	cfg, err := loadConfig(cmd, cfgArgs, getenv, stderr)
	if err != nil {
		return nil, err
	}
	store, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Options{MaxConns: 1})
	if err != nil {
		return nil, fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	return store, nil
}

// healthcheck asks the running service whether it is ready (GET /readyz) and
// fails unless it answers 200. It is the container healthcheck of
// docker-compose.yml: the image has no shell, curl or wget.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("url", "", "the URL to GET (default: /readyz at $HTTP_ADDR, on 127.0.0.1 when it names no host)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" {
		*target = readyzURL(getenv("HTTP_ADDR"))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s: %s %s", *target, resp.Status, bytes.TrimSpace(body))
	}
	_, err = fmt.Fprintf(stdout, "GET %s: %s %s\n", *target, resp.Status, bytes.TrimSpace(body))
	return err
}

// readyzURL is the /readyz URL of a service listening on addr (HTTP_ADDR,
// default :8080), on 127.0.0.1 when addr names no host or all of them.
func readyzURL(addr string) string {
	if addr == "" {
		addr = ":8080"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/readyz"
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz"
}
