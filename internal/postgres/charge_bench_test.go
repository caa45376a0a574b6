package postgres

import (
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"payments/internal/idempotency"
	"payments/internal/payment"
	"payments/internal/pgtest"
)

// chargeWithoutClaimSQL is chargeSQL with the key claim taken out: the same
// debit, charge, event and round trip, with nothing that makes it idempotent.
// It exists only to price the claim.
var chargeWithoutClaimSQL = strings.NewReplacer(
	`), claim AS (
    INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, body_encoding)
    SELECT $1, $2, $3, $4, $5, $6, $15 FROM debit
    ON CONFLICT (merchant_id, key) DO NOTHING
    RETURNING created_at
), charge AS (`, `), claim AS (
    SELECT now() AS created_at, $2::text, $3::bytea, $4::int, $5::text, $6::bytea, $15::text FROM debit
), charge AS (`,
).Replace(chargeSQL)

// BenchmarkKeyClaimOverhead prices the idempotency key claim: the charge
// statement with and without it, 16 clients in parallel over 1,000 accounts.
//
//	go test -run '^$' -bench KeyClaimOverhead -benchtime 10000x ./internal/postgres/
func BenchmarkKeyClaimOverhead(b *testing.B) {
	if chargeWithoutClaimSQL == chargeSQL {
		b.Fatal("the claim was not taken out of chargeSQL: update chargeWithoutClaimSQL")
	}
	s, err := Open(context.Background(), pgtest.NewDatabase(b), Options{MaxConns: 16})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	merchant := uuid.New()
	accounts := make([]uuid.UUID, 1000)
	for i := range accounts {
		accounts[i] = payment.NewID()
	}
	if _, err := s.pool.Exec(context.Background(), `
INSERT INTO merchants (id, name) VALUES ($1, 'bench');
`, merchant); err != nil {
		b.Fatal(err)
	}
	if _, err := s.pool.Exec(context.Background(), `
INSERT INTO accounts (merchant_id, id, currency, balance)
SELECT $1, a, 'USD', 1000000000000 FROM unnest($2::uuid[]) a`, merchant, accounts); err != nil {
		b.Fatal(err)
	}

	for _, v := range []struct {
		name string
		sql  string
	}{{"with-claim", chargeSQL}, {"without-claim", chargeWithoutClaimSQL}} {
		b.Run(v.name, func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(8) // 8 × GOMAXPROCS(2) = 16 clients
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					c := payment.NewCharge{AccountID: accounts[i%int64(len(accounts))], Amount: 1, Currency: "USD"}.Plan()
					var fp idempotency.Fingerprint
					_, _ = rand.Read(fp[:])
					body := []byte(`{"id":"x"}`)
					var check *int32
					var claimed any
					err := s.pool.QueryRow(context.Background(), v.sql,
						merchant, uuid.NewString(), fp[:], 201, "/v1/charges/x", body,
						c.AccountID, c.Amount, c.Currency, c.ID, c.Description, c.Metadata, c.CreatedAt, payment.NewID(),
						nil, string(body),
					).Scan(&check, &claimed)
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
