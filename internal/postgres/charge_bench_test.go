package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

// BenchmarkKeyClaimOverhead prices the idempotency key on the charge path:
// group-committed charges from 16 goroutines over 1,000 accounts, with the
// key (locked, looked up, stored with the response) and with it taken out of
// the same statements (postgres.ChargeDB.WithoutKeys). The overhead is
// with-key ns/op over without-key ns/op, minus one.
//
//	go test -run '^$' -bench KeyClaimOverhead -benchtime 20000x -count 5 ./internal/postgres/
func BenchmarkKeyClaimOverhead(b *testing.B) {
	for _, keyed := range []bool{true, false} {
		name := "with-key"
		if !keyed {
			name = "without-key"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			opts := postgres.Options{MaxConns: 20}
			store, err := postgres.Open(ctx, pgtest.NewDatabase(b), opts)
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			s := testkit.NewService(store, opts, charging.Options{})
			if !keyed {
				if err := s.WithoutKeys(); err != nil {
					b.Fatal(err)
				}
			}
			merchant, _, err := s.RegisterMerchant(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			accounts := make([]uuid.UUID, 1000)
			for i := range accounts {
				accounts[i] = payment.NewID()
			}
			if _, err := s.Pool().Exec(ctx, `
INSERT INTO accounts (merchant_id, id, currency, balance)
SELECT $1, a, 'USD', 1000000000000 FROM unnest($2::uuid[]) a`, merchant, accounts); err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			run := fmt.Sprintf("%s-%d-", name, b.N)
			b.SetParallelism(8) // 16 goroutines on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					var fp idempotency.Fingerprint
					_, _ = rand.Read(fp[:])
					_, err := s.CreateCharge(ctx, chargedb.KeyedCharge{
						Request: idempotency.Request{MerchantID: merchant, Key: fmt.Sprint(run, i), Fingerprint: fp},
						Charge:  payment.NewCharge{AccountID: accounts[i%int64(len(accounts))], Amount: 1, Currency: "USD"},
						Render:  testkit.RenderCharge,
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
