package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
)

// TestHeldEventsAreLogged: while a transaction of the service's database holds
// a committed event back, the outbox sample reports how long it has waited,
// and once that passes the threshold the warning names the holding backend's
// pid and transaction id; under the threshold, nothing is logged.
func TestHeldEventsAreLogged(t *testing.T) {
	const insertEvent = `INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES (gen_random_uuid(), gen_random_uuid(), 'account', gen_random_uuid(), 'account.created', '{}')`
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	holder, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	var (
		pid int32
		xid uint64
	)
	if _, err := holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid(), pg_current_xact_id()::text::bigint`).Scan(&pid, &xid); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, insertEvent); err != nil {
		t.Fatal(err)
	}
	// An event committed after the holder began: it waits for the holder.
	other, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, insertEvent); err != nil {
		t.Fatal(err)
	}
	monitor, err := postgres.OpenMonitor(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer monitor.Close()
	const wait = 200 * time.Millisecond
	time.Sleep(wait)

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := outboxSampler(monitor, time.Hour, log)(ctx); err != nil || logs.Len() != 0 {
		t.Fatalf("under the threshold: %v, logged %q; want nothing", err, logs.String())
	}
	sample, err := outboxSampler(monitor, wait, log)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sample.Held < wait || sample.Backlog != 1 {
		t.Errorf("sample %+v; want the 1 committed event, held at least %v", sample, wait)
	}
	line := logs.String()
	for _, want := range []string{"level=WARN", "events held back", fmt.Sprintf("pid=%d", pid), fmt.Sprintf("xid=%d", xid), "transaction_age="} {
		if !strings.Contains(line, want) {
			t.Errorf("the warning %q lacks %q", line, want)
		}
	}
}
