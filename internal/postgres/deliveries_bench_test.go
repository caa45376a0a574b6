package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// BenchmarkClaimWithBacklog is one delivery's round at the store, claim and
// record, for an endpoint with a backlog of 50,000 pending deliveries (a
// receiver back from an outage) and 3 others leased: what each delivery
// costs while the backlog is worked off.
//
//	go test -run '^$' -bench ClaimWithBacklog ./internal/postgres/
func BenchmarkClaimWithBacklog(b *testing.B) {
	ctx := context.Background()
	s := openStore(b, pgtest.NewDatabase(b))
	acme := newMerchant(b, s, "acme")
	addEndpoint(b, s, acme, payment.AllEvents)
	if _, err := s.Pool().Exec(ctx, `
INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
SELECT $1, gen_random_uuid(), 'account', gen_random_uuid(), 'account.created', '{}'
FROM generate_series(1, 50000)`, acme); err != nil {
		b.Fatal(err)
	}
	for {
		r, err := s.FanOut(ctx, 1000)
		if err != nil {
			b.Fatal(err)
		}
		if r.Created == 0 {
			break
		}
	}
	if _, err := s.Pool().Exec(ctx, `ANALYZE webhook_deliveries`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.ClaimDeliveries(ctx, 4, 64, 3, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		claimed, err := s.ClaimDeliveries(ctx, 4, 64, 1, time.Minute)
		if err != nil || len(claimed) != 1 {
			b.Fatalf("claimed %d, %v", len(claimed), err)
		}
		if _, err := s.RecordAttempt(ctx, claimed[0], payment.WebhookAttempt{At: time.Now(), Status: 204}); err != nil {
			b.Fatal(err)
		}
	}
}
