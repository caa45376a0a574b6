package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
)

// BenchmarkFanOutIdleEndpoints is one fan-out round that finds one new event
// for one active endpoint, beside 1,000 merchants that write nothing (100,000
// events of theirs written before, so the planner sees a table of events as
// in production) with no endpoint, or with 16 each: what 16,000 idle
// endpoints add to each round. The event is written outside the timer.
//
//	go test -run '^$' -bench FanOutIdleEndpoints -count 6 ./internal/postgres/
//
// With FANOUT_EXPLAIN=1 it logs, after the timed rounds, the plan of one more
// round as FanOut runs it (EXPLAIN (ANALYZE, BUFFERS), rolled back).
func BenchmarkFanOutIdleEndpoints(b *testing.B) {
	for _, idle := range []int{0, 16000} {
		b.Run(fmt.Sprintf("idle=%d", idle), func(b *testing.B) {
			ctx := context.Background()
			s := openStore(b, pgtest.NewDatabase(b))
			acme := newMerchant(b, s, "acme")
			addEndpoint(b, s, acme, payment.AllEvents)
			if _, err := s.Pool().Exec(ctx, `
WITH m AS (
    INSERT INTO merchants (id, name)
    SELECT gen_random_uuid(), 'idle ' || n FROM generate_series(1, 1000) n
    RETURNING id
)
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
SELECT m.id, gen_random_uuid(), 'account', gen_random_uuid(), 'charge.succeeded', '{"amount":100}'
FROM m, generate_series(1, 100)`); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Pool().Exec(ctx, `
INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, cursor_tx)
SELECT m.id, gen_random_uuid(), 'https://example.com/hook', '{*}', 'whsec_' || gen_random_uuid(), h.horizon
FROM merchants m, generate_series(1, $1::int / 1000), payments_event_horizon() h
WHERE m.name LIKE 'idle %'`, idle); err != nil {
				b.Fatal(err)
			}
			// Settle: whatever a first round does once for new endpoints.
			for {
				r, err := s.FanOut(ctx, 100)
				if err != nil {
					b.Fatal(err)
				}
				if !r.Again && r.Created == 0 {
					break
				}
			}
			if _, err := s.Pool().Exec(ctx, `VACUUM ANALYZE`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				webhooktest.AddEvent(b, s.Pool(), acme, payment.EventChargeSucceeded)
				b.StartTimer()
				if r, err := s.FanOut(ctx, 100); err != nil || r.Created != 1 {
					b.Fatalf("FanOut = %+v, %v; want 1 created", r, err)
				}
			}
			if os.Getenv("FANOUT_EXPLAIN") != "" {
				b.StopTimer()
				explainFanOut(b, s, acme)
			}
		})
	}
}

// explainFanOut logs EXPLAIN (ANALYZE, BUFFERS) of a round that finds one new
// event of the merchant's, in a transaction set up as FanOut's, rolled back.
func explainFanOut(b *testing.B, s *Store, merchant uuid.UUID) {
	b.Helper()
	ctx := context.Background()
	webhooktest.AddEvent(b, s.Pool(), merchant, payment.EventChargeSucceeded)
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx) // nothing to keep
	h, err := eventHorizon(ctx, tx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fanOutPlanSQL); err != nil {
		b.Fatal(err)
	}
	rows, _ := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+fanOutSQL,
		pgx.NamedArgs{"horizon": h.xid, "batch": 100, "scan": fanOutScan})
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	b.Log("\n" + strings.Join(plan, "\n"))
}
