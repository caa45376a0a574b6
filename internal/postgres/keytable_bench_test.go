package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// The janitor's defaults in cmd/payments: JANITOR_BATCH and the pause
// between batches that serve.go passes to idempotency.NewJanitor.
const (
	defaultJanitorBatch = 1000
	defaultJanitorPause = 10 * time.Millisecond
)

// BenchmarkKeyTable measures the idempotency key table for docs/scaling.md.
// It stores PAYMENTS_KEYTABLE_KEYS (default 200,000) fresh charges through
// charging.Path.CreateCharge, 16 goroutines over 1,000 accounts, each with a UUID
// Idempotency-Key and the response the API stores for a 201 (the charge's
// JSON and its Location); then reads the table's bytes on disk per key
// (heap, TOAST and both indexes, after VACUUM); then lets an
// idempotency.Janitor with the service's default batch and pause delete them
// all, and reports its keys/s, the WAL one batch writes, and the VACUUM the
// deletes leave to do. It takes a minute or two, so it is a benchmark, never
// part of make test:
//
//	go test -run '^$' -bench KeyTable -benchtime 1x -timeout 30m ./internal/postgres/
func BenchmarkKeyTable(b *testing.B) {
	n := 200_000
	if v := os.Getenv("PAYMENTS_KEYTABLE_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < defaultJanitorBatch {
			b.Fatalf("PAYMENTS_KEYTABLE_KEYS=%q: want an integer of at least %d", v, defaultJanitorBatch)
		}
	}
	ctx := context.Background()
	s, err := Open(ctx, pgtest.NewDatabase(b), Options{MaxConns: 20})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	path := charging.New(s, charging.Options{Waiters: 10}) // half of MaxConns, as cmd/payments sets it
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := s.Pool().Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}

	// Store the keys, as the API's fresh charges do.
	merchant, _, err := s.RegisterMerchant(ctx, "keytable")
	if err != nil {
		b.Fatal(err)
	}
	accounts := make([]uuid.UUID, 1000)
	for i := range accounts {
		accounts[i] = payment.NewID()
	}
	exec(`INSERT INTO accounts (merchant_id, id, currency, balance)
SELECT $1, a, 'USD', 1000000000000 FROM unnest($2::uuid[]) a`, merchant, accounts)
	// Every charge updates its account. Where autovacuum is off (it is on
	// this project's shared test server), the accounts' dead versions pile
	// up and charges slow down some thirtyfold within minutes; vacuum them
	// as autovacuum would. idempotency_keys is never updated: nothing to do.
	vacuumCtx, stopVacuum := context.WithCancel(ctx)
	vacuumed := make(chan struct{})
	go func() {
		defer close(vacuumed)
		for {
			select {
			case <-vacuumCtx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			_, _ = s.Pool().Exec(vacuumCtx, `VACUUM accounts`)
		}
	}()
	var next atomic.Int64
	var wg sync.WaitGroup
	began := time.Now()
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				account := accounts[i%int64(len(accounts))]
				body := []byte(`{"account_id":"` + payment.FormatID(payment.PrefixAccount, account) + `","amount":100,"currency":"USD"}`)
				_, err := path.CreateCharge(ctx, chargedb.KeyedCharge{
					Request: idempotency.Request{MerchantID: merchant, Key: uuid.NewString(),
						Fingerprint: idempotency.NewFingerprint(http.MethodPost, "/v1/charges", body)},
					Charge: payment.NewCharge{AccountID: account, Amount: 100, Currency: "USD"},
					Render: apiCreated,
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stopVacuum()
	<-vacuumed
	if b.Failed() {
		return
	}
	stored := time.Since(began)
	exec(`VACUUM (ANALYZE) idempotency_keys`)

	var (
		rows                                  int64
		heap, toast, pkey, byTime, total      int64
		rowBytes, bodyBytes, keyBytes, zstded float64
	)
	err = s.Pool().QueryRow(ctx, `
SELECT (SELECT count(*) FROM idempotency_keys),
       pg_relation_size('idempotency_keys'), pg_table_size('idempotency_keys') - pg_relation_size('idempotency_keys'),
       pg_relation_size('idempotency_keys_pkey'), pg_relation_size('idempotency_keys_created_at'),
       pg_total_relation_size('idempotency_keys'),
       (SELECT avg(pg_column_size(k.*)) FROM idempotency_keys k),
       (SELECT avg(octet_length(body)) FROM idempotency_keys),
       (SELECT avg(octet_length(key)) FROM idempotency_keys),
       (SELECT count(*) FILTER (WHERE body_encoding IS NOT NULL) FROM idempotency_keys)`).
		Scan(&rows, &heap, &toast, &pkey, &byTime, &total, &rowBytes, &bodyBytes, &keyBytes, &zstded)
	if err != nil {
		b.Fatal(err)
	}
	if rows != int64(n) {
		b.Fatalf("%d keys in the table, want %d", rows, n)
	}
	per := func(bytes int64) float64 { return float64(bytes) / float64(rows) }
	b.Logf("stored %d keys through CreateCharge in %s (%.0f charges/s in-process)", rows, stored.Round(time.Millisecond), float64(rows)/stored.Seconds())
	b.Logf("a key row: %.0f bytes as a tuple (pg_column_size), body %.0f bytes, key %.0f characters; %.0f bodies zstd-compressed",
		rowBytes, bodyBytes, keyBytes, zstded)
	b.Logf("on disk after VACUUM: heap %d (%.1f B/key), TOAST+FSM+VM %d (%.1f B/key), primary key %d (%.1f B/key), created_at index %d (%.1f B/key); total %d = %.1f B/key",
		heap, per(heap), toast, per(toast), pkey, per(pkey), byTime, per(byTime), total, per(total))
	b.ReportMetric(per(total), "bytes/key")
	b.ReportMetric(per(heap+toast), "table-bytes/key")
	b.ReportMetric(per(pkey+byTime), "index-bytes/key")

	// Every key is expired under a TTL of one second; the janitor's statement
	// and plan are the same whatever the TTL.
	time.Sleep(1100 * time.Millisecond)
	const ttl = time.Second

	// The WAL of one batch: EXPLAIN ANALYZE runs the janitor's DELETE, counts
	// the WAL it writes (its own, whatever else the server does), and the
	// transaction rolls back, leaving the keys to the janitor.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var plan []struct {
		Plan struct {
			WALRecords int64 `json:"WAL Records"`
			WALFPI     int64 `json:"WAL FPI"`
			WALBytes   int64 `json:"WAL Bytes"`
		}
		ExecutionTime float64 `json:"Execution Time"`
	}
	err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, WAL, FORMAT JSON) `+deleteExpiredKeysSQL, ttl, defaultJanitorBatch).Scan(&plan)
	_ = tx.Rollback(ctx)
	if err != nil || len(plan) != 1 {
		b.Fatalf("explain the janitor's delete: %v (%d plans)", err, len(plan))
	}
	p := plan[0]
	b.Logf("one janitor batch (%d keys): %.1f ms; WAL %d records, %d full-page images, %d bytes (%.0f B/key deleted)",
		defaultJanitorBatch, p.ExecutionTime, p.Plan.WALRecords, p.Plan.WALFPI, p.Plan.WALBytes, float64(p.Plan.WALBytes)/defaultJanitorBatch)
	b.ReportMetric(float64(p.Plan.WALBytes)/defaultJanitorBatch, "delete-WAL-bytes/key")
	exec(`VACUUM idempotency_keys`) // what the rolled-back delete touched

	j := idempotency.NewJanitor(s, slog.New(slog.NewTextHandler(io.Discard, nil)), ttl, time.Hour, defaultJanitorBatch, defaultJanitorPause)
	began = time.Now()
	deleted, err := j.Sweep(ctx)
	swept := time.Since(began)
	if err != nil || deleted != int64(n) {
		b.Fatalf("the janitor deleted %d keys (%v), want %d", deleted, err, n)
	}
	batches := (deleted + defaultJanitorBatch - 1) / defaultJanitorBatch
	deleting := swept - time.Duration(batches)*defaultJanitorPause
	b.Logf("janitor (batch %d, pause %s): deleted %d keys in %s = %.0f keys/s; %d batches, %.1f ms each without the pauses",
		defaultJanitorBatch, defaultJanitorPause, deleted, swept.Round(time.Millisecond), float64(deleted)/swept.Seconds(),
		batches, float64(deleting.Microseconds())/1000/float64(batches))
	b.ReportMetric(float64(deleted)/swept.Seconds(), "janitor-keys/s")

	began = time.Now()
	exec(`VACUUM idempotency_keys`)
	vacuumTook := time.Since(began)
	if err := s.Pool().QueryRow(ctx, `SELECT pg_total_relation_size('idempotency_keys')`).Scan(&total); err != nil {
		b.Fatal(err)
	}
	b.Logf("VACUUM after the janitor: %s; the empty table and its indexes then take %d bytes",
		vacuumTook.Round(time.Millisecond), total)
	b.ReportMetric(vacuumTook.Seconds(), "vacuum-s")
}

// apiCreated renders a charge as the API does for a 201 (httpapi's
// createCharge): the charge's JSON and a newline, and its Location.
func apiCreated(c payment.Charge, body []byte, err error) (idempotency.Response, error) {
	if err != nil {
		return idempotency.Response{}, err
	}
	if c.Status != payment.ChargeSucceeded {
		return idempotency.Response{}, fmt.Errorf("charge %s: %s", c.ID, c.Status)
	}
	if !json.Valid(body) {
		return idempotency.Response{}, fmt.Errorf("charge %s: invalid JSON", c.ID)
	}
	return idempotency.Response{Status: http.StatusCreated, Location: "/v1/charges/" + payment.FormatID(payment.PrefixCharge, c.ID),
		Body: append(body, '\n')}, nil
}
