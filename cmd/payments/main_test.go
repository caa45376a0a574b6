package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

func TestMain(m *testing.M) { procsimtest.Main(m) }

func envOf(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// TestServeEndToEnd runs the real program: migrate, create a merchant, serve,
// charge and replay over HTTP, then shut down on cancel.
func TestServeEndToEnd(t *testing.T) {
	// Registered first, so it runs last: serve, its relay and janitor, and the
	// consumer must leave no goroutine behind once they return.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	dbURL := pgtest.NewDatabase(t)
	natsURL := testkit.StartNATS(t).URL()
	env := envOf(map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "NATS_URL": natsURL, "RELAY_POLL": "100ms",
		"METRICS_ADDR": "127.0.0.1:0"})
	ctx := context.Background()

	var out bytes.Buffer
	if err := run(ctx, []string{"migrate", "up"}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !migrated.MatchString(out.String()) {
		t.Errorf("migrate up printed %q", out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"merchants", "create", "--name", "Acme"}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var merchant struct {
		MerchantID string `json:"merchant_id"`
		APIKey     string `json:"api_key"`
	}
	if err := json.Unmarshal(out.Bytes(), &merchant); err != nil || merchant.APIKey == "" || merchant.MerchantID == "" {
		t.Fatalf("merchants create printed %q (%v)", out.String(), err)
	}

	logs := &testkit.LogBuffer{}
	start := func(args ...string) {
		cmdCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(cmdCtx, args, env, io.Discard, logs) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("%s returned %v", args[0], err)
			}
			if strings.Contains(logs.String(), merchant.APIKey) {
				t.Error("the API key appears in the logs")
			}
		})
	}
	start("serve", "--shutdown-delay", "0", "--shutdown-timeout", "5s")
	start("consume")

	addr := waitForAddr(t, logs)
	post := func(path, key, body string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+merchant.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, body := post("/v1/accounts", uuid.NewString(), `{"currency":"USD"}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create account: %d %s", resp.StatusCode, body)
	}
	var acct struct{ ID string }
	_ = json.Unmarshal(body, &acct)
	if resp, body = post("/v1/accounts/"+acct.ID+"/deposits", uuid.NewString(), `{"amount":1000}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("deposit: %d %s", resp.StatusCode, body)
	}
	key := uuid.NewString()
	charge := `{"account_id":"` + acct.ID + `","amount":250,"currency":"USD"}`
	first, firstBody := post("/v1/charges", key, charge)
	again, againBody := post("/v1/charges", key, charge)
	if first.StatusCode != http.StatusCreated || !bytes.Equal(firstBody, againBody) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("charge %d %s; replay %d %s", first.StatusCode, firstBody, again.StatusCode, againBody)
	}
	// The relay inside serve publishes the events, and the consumer projects
	// the balance from them alone.
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var projected int64
		err := pool.QueryRow(ctx, `SELECT balance FROM account_balances`).Scan(&projected)
		if err == nil && projected == 750 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer's projected balance is %d (%v), want 750; logs:\n%s", projected, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	out.Reset()
	if err := run(ctx, []string{"healthcheck"}, envOf(map[string]string{"HTTP_ADDR": addr}), &out, io.Discard); err != nil ||
		!strings.Contains(out.String(), "200 OK") {
		t.Errorf("healthcheck = %v, printed %q", err, out.String())
	}
	for _, path := range []string{"/readyz", "/openapi.yaml", "/docs/"} {
		r, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d", path, r.StatusCode)
		}
	}

	// The metrics are on METRICS_ADDR alone.
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics on the API: %d, want 404", r.StatusCode)
	}
	metrics := scrape(t, waitForMetricsAddr(t, logs))
	if !strings.Contains(metrics, `payments_charges_total{status="succeeded"} 1`) {
		t.Errorf("the metrics lack the charge:\n%s", metrics)
	}
	// The relay inside serve exports the relay's series on serve's listener:
	// the three events the consumer applied (account, deposit, charge), each
	// timed from its commit to its acknowledgement.
	for _, series := range []string{"payments_relay_published_total 3\n", "payments_relay_commit_to_publish_seconds_count 3\n",
		"payments_relay_batch_events_sum 3\n", `payments_relay_publish_failures_total{reason="timeout"} 0` + "\n"} {
		if !strings.Contains(metrics, series) {
			t.Errorf("serve's metrics lack %q", strings.TrimSpace(series))
		}
	}
	// The charge batcher's series, which PaymentsChargePathStuck compares:
	// the bound is IDEMPOTENCY_WAIT + COMMIT_WAIT, 5 s each by default.
	for _, series := range []string{"payments_charge_batch_age_seconds 0\n", "payments_charge_batch_stuck_after_seconds 10\n",
		"payments_charge_queue_wait_seconds 0\n", "payments_charge_batches_total 1\n", "payments_charge_queue_timeouts_total 0\n",
		`payments_charges_abandoned_total{outcome="executed"} 0` + "\n"} {
		if !strings.Contains(metrics, series) {
			t.Errorf("the metrics lack %q", strings.TrimSpace(series))
		}
	}
	// Headers over 16 KiB (plus net/http's 4 KiB of slack) are refused.
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/healthz", nil)
	req.Header.Set("X-Padding", strings.Repeat("p", 24<<10))
	if r, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 24 KiB header: %d, want 431", r.StatusCode)
	}
}

// waitForMetricsAddr returns the address of serve's METRICS_ADDR listener,
// once serve has logged it.
func waitForMetricsAddr(t *testing.T, logs *testkit.LogBuffer) string {
	t.Helper()
	return waitForMetricsOf(t, logs, "serve")
}

// waitForMetricsOf returns the address of command's METRICS_ADDR listener
// (serve, relay or consume), once it has logged it.
func waitForMetricsOf(t *testing.T, logs *testkit.LogBuffer, command string) string {
	t.Helper()
	listening := regexp.MustCompile(`"msg":"metrics listening","addr":"([^"]+)","command":"` + command + `"`)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			return m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not report its metrics address; logs:\n%s", command, logs.String())
	return ""
}

// scrape GETs /metrics at addr.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", r.StatusCode, err)
	}
	return string(b)
}

// migrated matches what migrate prints once every migration is applied.
var migrated = regexp.MustCompile(`^schema version [1-9][0-9]* \(dirty: false\)\n$`)

var listening = regexp.MustCompile(`"msg":"listening","addr":"([^"]+)"`)

func waitForAddr(t *testing.T, logs *testkit.LogBuffer) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			return m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("serve did not report its address; logs:\n%s", logs.String())
	return ""
}

func TestBadConfigurationNamesTheVariable(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"ttl", map[string]string{"IDEMPOTENCY_TTL": "forever"}, nil, "IDEMPOTENCY_TTL"},
		{"wait", map[string]string{"IDEMPOTENCY_WAIT": "-1s"}, nil, "IDEMPOTENCY_WAIT"},
		{"pool", map[string]string{"DB_MAX_CONNS": "zero"}, nil, "DB_MAX_CONNS"},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{"flag overrides env", map[string]string{"IDEMPOTENCY_TTL": "1h"}, []string{"--idempotency-ttl", "soon"}, "--idempotency-ttl"},
		{"database url", map[string]string{"DATABASE_URL": "::not a url"}, nil, "DATABASE_URL"},
		{"metrics sample", map[string]string{"METRICS_SAMPLE": "500ms"}, nil, "METRICS_SAMPLE"},
		{"metrics addr", map[string]string{"METRICS_ADDR": "127.0.0.1:-1"}, nil, "METRICS_ADDR"},
		{"shutdown delay", map[string]string{"SHUTDOWN_DELAY": "-1s"}, nil, "SHUTDOWN_DELAY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["HTTP_ADDR"] = "127.0.0.1:0"
			err := run(context.Background(), append([]string{"serve"}, tc.args...), envOf(tc.env), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if err := run(context.Background(), []string{"bogus"}, envOf(nil), io.Discard, io.Discard); err == nil {
		t.Error("an unknown command succeeded")
	}
}

// TestSettingsThatBreakTheGuaranteeAreRefused: values that parse but would
// break the idempotency guarantee, alone or together, stop the service at
// start with a message naming the variable.
func TestSettingsThatBreakTheGuaranteeAreRefused(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"ttl below the floor", map[string]string{"IDEMPOTENCY_TTL": "2s"}, nil, "invalid IDEMPOTENCY_TTL: 2s is below the floor of 1h0m0s"},
		{"ttl just below the floor", map[string]string{"IDEMPOTENCY_TTL": "59m59s"}, nil, "invalid IDEMPOTENCY_TTL"},
		{"ttl flag", nil, []string{"--idempotency-ttl", "10m"}, "invalid --idempotency-ttl"},
		{"wait rounds to 0 ms", map[string]string{"IDEMPOTENCY_WAIT": "900us"}, nil, "invalid IDEMPOTENCY_WAIT: 900µs rounds to 0 ms"},
		{"wait too long", map[string]string{"IDEMPOTENCY_WAIT": "21s"}, nil, "invalid IDEMPOTENCY_WAIT: 21s is above the cap of 20s"},
		{"commit wait too short", map[string]string{"COMMIT_WAIT": "99ms"}, nil, "invalid COMMIT_WAIT: 99ms is below the floor of 100ms"},
		{"commit wait too long", map[string]string{"COMMIT_WAIT": "21s"}, nil, "invalid COMMIT_WAIT: 21s is above the cap of 20s"},
		{"janitor too often", map[string]string{"JANITOR_INTERVAL": "10ms"}, nil, "invalid JANITOR_INTERVAL"},
		{"events pruned before their webhooks' last retry", map[string]string{"EVENT_RETENTION": "72h"}, nil,
			"invalid EVENT_RETENTION: 72h0m0s is not above the 72h0m0s webhook deliveries are retried for"},
		{"a hold too short", map[string]string{"CHARGE_AUTHORIZATION_TTL": "500ms"}, nil, "invalid CHARGE_AUTHORIZATION_TTL: 500ms is below 1s"},
		{"a hold too long", map[string]string{"CHARGE_AUTHORIZATION_TTL": "745h"}, nil, "invalid CHARGE_AUTHORIZATION_TTL: 745h0m0s is above 744h0m0s"},
		{"a hold the waits outlast", map[string]string{"CHARGE_AUTHORIZATION_TTL": "1s"}, nil,
			"invalid CHARGE_AUTHORIZATION_TTL: 1s is not above IDEMPOTENCY_WAIT (5s), COMMIT_WAIT (5s) and 1s"},
		{"a hold the waits outlast, waits moved", map[string]string{"CHARGE_AUTHORIZATION_TTL": "12s", "IDEMPOTENCY_WAIT": "10s"}, nil,
			"invalid CHARGE_AUTHORIZATION_TTL: 12s is not above IDEMPOTENCY_WAIT (10s), COMMIT_WAIT (5s) and 1s"},
		{"janitor slower than the ttl", map[string]string{"IDEMPOTENCY_TTL": "2h", "JANITOR_INTERVAL": "3h"}, nil, "invalid JANITOR_INTERVAL: 3h0m0s exceeds IDEMPOTENCY_TTL"},
		{"janitor batch too large", map[string]string{"JANITOR_BATCH": "1000000"}, nil, "invalid JANITOR_BATCH"},
		{"batches take every connection", map[string]string{"CHARGE_BATCHES": "4", "DB_MAX_CONNS": "4"}, nil, "invalid CHARGE_BATCHES: 4 leaves no connection of DB_MAX_CONNS (4)"},
		{"batches beyond the pool", map[string]string{"CHARGE_BATCHES": "30"}, nil, "invalid CHARGE_BATCHES"},
		{"cache bytes malformed", map[string]string{"IDEMPOTENCY_CACHE_BYTES": "64MB"}, nil, "invalid IDEMPOTENCY_CACHE_BYTES"},
		{"cache bytes negative", map[string]string{"IDEMPOTENCY_CACHE_BYTES": "-1"}, nil, "invalid IDEMPOTENCY_CACHE_BYTES"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
			for k, v := range tc.env {
				env[k] = v
			}
			err := run(context.Background(), append([]string{"serve"}, tc.args...), envOf(env), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run = %v, want an error containing %q", err, tc.want)
			}
		})
	}

	// The boundaries themselves, and the defaults, are accepted.
	ok := map[string]string{"IDEMPOTENCY_TTL": "1h", "IDEMPOTENCY_WAIT": "1ms", "JANITOR_INTERVAL": "1h",
		"JANITOR_BATCH": "100000", "CHARGE_BATCHES": "19", "IDEMPOTENCY_CACHE_BYTES": "0", "COMMIT_WAIT": "100ms", "SHUTDOWN_DELAY": "0"}
	for _, env := range []map[string]string{nil, ok, {"IDEMPOTENCY_WAIT": "20s", "IDEMPOTENCY_CACHE_BYTES": "1GiB", "COMMIT_WAIT": "20s"}} {
		cfg, err := loadConfig("serve", nil, envOf(env), io.Discard, io.Discard)
		if err != nil {
			t.Errorf("loadConfig(%v) = %v", env, err)
		}
		if env == nil && (cfg.Keys.CacheBytes != 64<<20 || cfg.Keys.TTL != 24*time.Hour || cfg.Shutdown.Delay != 5*time.Second) {
			t.Errorf("defaults: cache bytes %d, TTL %s, shutdown delay %s", cfg.Keys.CacheBytes, cfg.Keys.TTL, cfg.Shutdown.Delay)
		}
	}
}

// TestMigrateCreatesMissingDatabase: a newcomer without psql gets the database
// created by "migrate up".
func TestMigrateCreatesMissingDatabase(t *testing.T) {
	admin := pgtest.AdminURL(t)
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	name := "payments_test_created_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	t.Cleanup(func() {
		conn, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	var out, errs bytes.Buffer
	if err := run(context.Background(), []string{"migrate", "up"}, envOf(map[string]string{"DATABASE_URL": u.String()}), &out, &errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errs.String(), "created database") || !migrated.MatchString(out.String()) {
		t.Errorf("stdout %q, stderr %q", out.String(), errs.String())
	}
}

// TestMigrateWaitsForPostgreSQL: "migrate up" next to a PostgreSQL that is still
// starting waits for it, a line per wait, and migrates once it answers.
func TestMigrateWaitsForPostgreSQL(t *testing.T) {
	admin, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	name := "payments_test_waited_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	dropDatabaseAtCleanup(t, admin.String(), name)
	target := *admin
	target.Host = port
	target.Path = "/" + name

	// The server "starts" 1.5 s later: a TCP relay to the real one opens the port.
	started := make(chan struct{})
	go func() {
		defer close(started)
		time.Sleep(1500 * time.Millisecond)
		relayTCP(t, port, admin.Host)
	}()
	defer func() { <-started }()
	var out bytes.Buffer
	errs := &testkit.LogBuffer{}
	env := envOf(map[string]string{"DATABASE_URL": target.String(), "MIGRATE_WAIT": "20s"})
	if err := run(context.Background(), []string{"migrate", "up"}, env, &out, errs); err != nil {
		t.Fatalf("migrate up: %v\nstderr:\n%s", err, errs)
	}
	wait := "waiting for PostgreSQL at " + port + ": connect: connection refused\n"
	if n := strings.Count(errs.String(), wait); n < 1 || !migrated.MatchString(out.String()) {
		t.Errorf("stdout %q; stderr has %d lines %q:\n%s", out.String(), n, wait, errs)
	}
}

// TestMigrateWaitIsBounded: nobody ever listens, so "migrate up" gives up after
// MIGRATE_WAIT with an error naming the server and the cause.
func TestMigrateWaitIsBounded(t *testing.T) {
	port := freePort(t)
	var errs bytes.Buffer
	env := envOf(map[string]string{
		"DATABASE_URL": "postgres://postgres@" + port + "/payments?sslmode=disable",
		"MIGRATE_WAIT": "2500ms",
	})
	start := time.Now()
	err := run(context.Background(), []string{"migrate", "up"}, env, io.Discard, &errs)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL at "+port+" did not accept connections within 2.5s (MIGRATE_WAIT)") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Errorf("migrate up = %v", err)
	}
	// Attempts at 0, 1, 2 and 2.5 s: a line for each of the first three.
	if n := strings.Count(errs.String(), "waiting for PostgreSQL at "+port+": connect: connection refused\n"); n < 2 || n > 3 {
		t.Errorf("want 3 waiting lines in 2.5 s, got %d:\n%s", n, errs.String())
	}
	if took < 2500*time.Millisecond || took > 10*time.Second {
		t.Errorf("migrate up gave up after %s, want about 2.5 s", took)
	}
}

// TestMigrateDoesNotRetryServerErrors: a server that answers with an error
// (here: no such role) fails at once, without waiting.
func TestMigrateDoesNotRetryServerErrors(t *testing.T) {
	u, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("nobody_" + strings.ReplaceAll(uuid.NewString()[:8], "-", ""))
	var errs bytes.Buffer
	env := envOf(map[string]string{"DATABASE_URL": u.String(), "MIGRATE_WAIT": "30s"})
	start := time.Now()
	err = run(context.Background(), []string{"migrate", "up"}, env, io.Discard, &errs)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Code, "28") { // invalid authorization
		t.Errorf("migrate up = %v, want an authorization error from the server", err)
	}
	if strings.Contains(errs.String(), "waiting for") || time.Since(start) > 5*time.Second {
		t.Errorf("migrate up waited (%s):\n%s", time.Since(start), errs.String())
	}
}

// freePort returns a 127.0.0.1:port that nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// relayTCP listens on addr and relays each connection to upstream until the
// test ends.
func relayTCP(t *testing.T, addr, upstream string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Errorf("relay: %v", err)
		return
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			track(down)
			track(up)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(up, down); up.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(down, up); down.Close() }()
		}
	}()
}

// dropDatabaseAtCleanup drops database name on the admin server when the test ends.
func dropDatabaseAtCleanup(t *testing.T, adminURL, name string) {
	t.Helper()
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), adminURL)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
}

// TestHealthcheck: "payments healthcheck" exits 0 only on a 200 from /readyz,
// and finds it from HTTP_ADDR.
func TestHealthcheck(t *testing.T) {
	ready := true
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if !ready {
			http.Error(w, `{"status":503}`, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, `{"status":"ready"}`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	env := envOf(map[string]string{"HTTP_ADDR": addr})
	if err := run(context.Background(), []string{"healthcheck"}, env, io.Discard, io.Discard); err != nil {
		t.Errorf("ready: healthcheck = %v", err)
	}
	mu.Lock()
	ready = false
	mu.Unlock()
	if err := run(context.Background(), []string{"healthcheck"}, env, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("not ready: healthcheck = %v, want an error naming 503", err)
	}
	nobody := "http://" + freePort(t) + "/readyz"
	if err := run(context.Background(), []string{"healthcheck", "--url", nobody}, envOf(nil), io.Discard, io.Discard); err == nil {
		t.Error("healthcheck of a port nobody listens on succeeded")
	}

	for addr, want := range map[string]string{
		"":               "http://127.0.0.1:8080/readyz",
		":8080":          "http://127.0.0.1:8080/readyz",
		"0.0.0.0:9000":   "http://127.0.0.1:9000/readyz",
		"[::]:9000":      "http://127.0.0.1:9000/readyz",
		"localhost:8081": "http://localhost:8081/readyz",
		"[::1]:8082":     "http://[::1]:8082/readyz",
	} {
		if got := readyzURL(addr); got != want {
			t.Errorf("readyzURL(%q) = %q, want %q", addr, got, want)
		}
	}
}
