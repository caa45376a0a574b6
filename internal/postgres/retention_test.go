package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestRetentionCountsFromTheStoredResponse reproduces a double deposit
// found in an adversarial review: with a retention of 2 s, a request whose transaction is held 3 s by
// a row lock, then retried at once, must execute once. Counted from the start
// of its transaction, its key was already expired when it committed.
func TestRetentionCountsFromTheStoredResponse(t *testing.T) {
	const ttl, hold = 2 * time.Second, 3 * time.Second
	url := pgtest.DatabaseURL(t)
	ctx := context.Background()
	paths := map[string]func(s testkit.Service, req idempotency.Request, account uuid.UUID) (idempotency.Result, error){
		"deposit": func(s testkit.Service, req idempotency.Request, account uuid.UUID) (idempotency.Result, error) {
			return s.Execute(ctx, req, func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
				_, err := l.Deposit(ctx, req.MerchantID, account, 500)
				return idempotency.Response{Status: 201, Body: []byte(`{}`)}, err
			})
		},
		"charge": func(s testkit.Service, req idempotency.Request, account uuid.UUID) (idempotency.Result, error) {
			return s.CreateCharge(ctx, chargedb.KeyedCharge{Request: req, Render: testkit.RenderCharge,
				Charge: payment.NewCharge{AccountID: account, Amount: 100, Currency: "USD"}})
		},
	}
	for name, execute := range paths {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := testkit.OpenService(t, url, postgres.Options{KeyTTL: ttl}, charging.Options{})
			merchant, _, err := s.RegisterMerchant(ctx, t.Name())
			if err != nil {
				t.Fatal(err)
			}
			var account uuid.UUID
			if _, err := s.Execute(ctx, idempotency.Request{MerchantID: merchant, Key: "open"},
				func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
					a, err := l.CreateAccount(ctx, merchant, payment.NewAccount{Currency: "USD"})
					if err == nil {
						_, err = l.Deposit(ctx, merchant, a.ID, 10_000)
					}
					account = a.ID
					return idempotency.Response{Status: 201, Body: []byte(`{}`)}, err
				}); err != nil {
				t.Fatal(err)
			}

			// Another transaction holds the account, so the first request
			// claims its key and then waits longer than the retention.
			holder, err := s.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := holder.Exec(ctx, `SELECT FROM accounts WHERE id = $1 FOR UPDATE`, account); err != nil {
				t.Fatal(err)
			}
			req := idempotency.Request{MerchantID: merchant, Key: "slow-" + name, Fingerprint: idempotency.NewFingerprint("POST", name, nil)}
			first := make(chan error, 1)
			go func() { _, err := execute(s, req, account); first <- err }()
			time.Sleep(hold)
			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-first; err != nil {
				t.Fatalf("first request: %v", err)
			}

			retry, err := execute(s, req, account)
			if err != nil {
				t.Fatalf("retry: %v", err)
			}
			var deposits, charges int
			if err := s.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM deposits WHERE account_id = $1),
				(SELECT count(*) FROM charges WHERE account_id = $1)`, account).Scan(&deposits, &charges); err != nil {
				t.Fatal(err)
			}
			executions := deposits - 1 + charges // the account was opened with one deposit
			if executions != 1 || !retry.Replayed {
				t.Errorf("executions for one key: %d (replayed: %v), want 1", executions, retry.Replayed)
			}
		})
	}
}
