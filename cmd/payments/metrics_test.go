package main

import (
	"context"
	"io"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestScrapesDoNoDatabaseWork: with 40 events waiting in the outbox, 100
// scrapes of METRICS_ADDR read the outbox 0 times (its scans in
// pg_stat_user_tables) and take no connection from the service's pool; the
// backlog comes from the one sample taken at start. (pg_stat_database's
// transaction count would do, but autovacuum's visits add to it.)
func TestScrapesDoNoDatabaseWork(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(ctx) })
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(ctx) })
	if _, err := db.Exec(ctx, `
ALTER TABLE events SET (autovacuum_enabled = false);
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload, created_at)
SELECT gen_random_uuid(), gen_random_uuid(), 'account', gen_random_uuid(), 'account.created', '{}', now() - interval '10 minutes'
FROM generate_series(1, 40)`); err != nil {
		t.Fatal(err)
	}

	env := envOf(map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0",
		"METRICS_SAMPLE": "1h", "RELAY_ENABLED": "false", "JANITOR_INTERVAL": "1h", "SHUTDOWN_DELAY": "0",
		// The other background work that takes pool connections, quiet too.
		"CHARGE_EXPIRY_INTERVAL": "1h", "WEBHOOK_DELIVERY": "false"})
	logs := &testkit.LogBuffer{}
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(serveCtx, []string{"serve"}, env, io.Discard, logs) }()
	stopped := false
	stopServe := func() {
		if !stopped {
			stopped = true
			stop()
			if err := <-done; err != nil {
				t.Errorf("serve returned %v", err)
			}
		}
	}
	t.Cleanup(stopServe)
	addr := waitForMetricsAddr(t, logs)
	for !strings.Contains(scrape(t, addr), "payments_outbox_samples_total 1\n") {
		time.Sleep(10 * time.Millisecond)
	}

	// A backend reports its scans up to 10 s late (PGSTAT_IDLE_INTERVAL): wait
	// until the count has held still that long.
	scans := func() int64 {
		var n int64
		if err := db.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables
WHERE relname = 'events'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	settled := func(quiet time.Duration) int64 {
		n, since := scans(), time.Now()
		for time.Since(since) < quiet {
			time.Sleep(250 * time.Millisecond)
			if m := scans(); m != n {
				n, since = m, time.Now()
			}
		}
		return n
	}
	before := settled(11 * time.Second)
	first := scrape(t, addr)
	last := first
	for range 99 {
		last = scrape(t, addr)
	}
	// Ending the service ends its connections, and a backend reports its
	// scans as it exits.
	stopServe()
	for {
		var backends int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'payments%'`,
			dbName).Scan(&backends); err != nil {
			t.Fatal(err)
		}
		if backends == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := settled(time.Second)

	if after != before {
		t.Errorf("100 scrapes: %d scans of the outbox, want 0", after-before)
	}
	acquires := regexp.MustCompile(`(?m)^payments_db_pool_acquires_total (\S+)$`)
	a, b := acquires.FindStringSubmatch(first), acquires.FindStringSubmatch(last)
	if a == nil || b == nil {
		t.Fatalf("no payments_db_pool_acquires_total in the scrapes")
	}
	if a[1] != b[1] {
		t.Errorf("pool acquires over 100 scrapes: %s then %s, want the same", a[1], b[1])
	}
	for _, want := range []string{"payments_outbox_backlog_events 40\n", "payments_outbox_samples_total 1\n"} {
		if !strings.Contains(last, want) {
			t.Errorf("the last scrape lacks %q", want)
		}
	}
	t.Logf("100 scrapes: %d scans of the outbox (%d -> %d), pool acquires %s -> %s", after-before, before, after, a[1], b[1])
}
