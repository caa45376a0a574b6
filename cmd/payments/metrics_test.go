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

	"payments/internal/pgtest"
)

// TestScrapesDoNoDatabaseWork: with 40 events waiting in the outbox, 100
// scrapes of METRICS_ADDR cause 0 transactions in the service's database
// (pg_stat_database) and take no connection from its pool; the backlog comes
// from the one sample taken at start.
func TestScrapesDoNoDatabaseWork(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL(t)) // another database: its reads count there
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(ctx) })
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `
ALTER TABLE events SET (autovacuum_enabled = false);
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload, created_at)
SELECT gen_random_uuid(), gen_random_uuid(), 'account', gen_random_uuid(), 'account.created', '{}', now() - interval '10 minutes'
FROM generate_series(1, 40)`); err != nil {
		t.Fatal(err)
	}
	_ = db.Close(ctx)

	env := envOf(map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0",
		"METRICS_SAMPLE": "1h", "RELAY_ENABLED": "false", "JANITOR_INTERVAL": "1h"})
	logs := &lockedBuffer{}
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

	// A backend reports its transactions up to 10 s late (PGSTAT_IDLE_INTERVAL):
	// wait until the count has held still that long.
	xacts := func() int64 {
		var n int64
		if err := admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`,
			dbName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	settled := func(quiet time.Duration) int64 {
		n, since := xacts(), time.Now()
		for time.Since(since) < quiet {
			time.Sleep(250 * time.Millisecond)
			if m := xacts(); m != n {
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
	// transactions as it exits.
	stopServe()
	for {
		var backends int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, dbName).Scan(&backends); err != nil {
			t.Fatal(err)
		}
		if backends == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := settled(time.Second)

	if after != before {
		t.Errorf("100 scrapes: %d transactions in the service's database, want 0", after-before)
	}
	acquires := regexp.MustCompile(`(?m)^payments_db_pool_acquires_total (\S+)$`)
	if a, b := acquires.FindStringSubmatch(first), acquires.FindStringSubmatch(last); a == nil || b == nil || a[1] != b[1] {
		t.Errorf("pool acquires over 100 scrapes: %v then %v, want the same", a, b)
	}
	for _, want := range []string{"payments_outbox_backlog_events 40\n", "payments_outbox_samples_total 1\n"} {
		if !strings.Contains(last, want) {
			t.Errorf("the last scrape lacks %q", want)
		}
	}
	t.Logf("100 scrapes: %d transactions (pg_stat_database %d -> %d)", after-before, before, after)
}
