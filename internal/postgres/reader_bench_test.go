package postgres_test

import (
	"context"
	"testing"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
)

// BenchmarkAccountRead prices a read: GET /v1/accounts/{id}'s query from 8
// goroutines, alone ("quiet") and while another connection commits one
// small write after another ("writes"), so that most reads see a
// transaction their last confirmation did not (confirmed.go).
//
//	go test -run '^$' -bench AccountRead -count 5 ./internal/postgres/
func BenchmarkAccountRead(b *testing.B) {
	for _, writes := range []bool{false, true} {
		name := "quiet"
		if writes {
			name = "writes"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := postgres.Open(ctx, pgtest.NewDatabase(b), postgres.Options{MaxConns: 12})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			merchant, _, err := s.RegisterMerchant(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			acct, other := payment.NewID(), payment.NewID()
			if _, err := s.Pool().Exec(ctx, `INSERT INTO accounts (merchant_id, id, currency, balance)
VALUES ($1, $2, 'USD', 100), ($1, $3, 'USD', 100)`, merchant, acct, other); err != nil {
				b.Fatal(err)
			}
			stop, stopped := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(stopped)
				for writes {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := s.Pool().Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = $1`, other); err != nil {
						b.Error(err)
						return
					}
				}
			}()
			b.SetParallelism(4) // 8 goroutines on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Account(ctx, merchant, acct); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			close(stop)
			<-stopped
		})
	}
}
