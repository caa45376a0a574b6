package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestKeyBoundToAnOperation: a step that starts an operation going on after
// its transaction binds the key to it. The key then answers "in progress,
// see this operation" to its retries, which never run the step again; it
// refuses another request, never expires, and is not the janitor's, however
// old; the charge batch refuses it as reused. Once the operation stores its
// response, the key replays it byte for byte and expires as any other.
func TestKeyBoundToAnOperation(t *testing.T) {
	ctx := context.Background()
	const ttl = time.Hour
	s := testkit.OpenService(t, pgtest.NewDatabase(t), postgres.Options{KeyTTL: ttl}, charging.Options{})
	merchant, _, err := s.RegisterMerchant(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	op := uuid.New()
	req := idempotency.Request{MerchantID: merchant, Key: "card-charge", Fingerprint: idempotency.Fingerprint{7}}
	runs := 0
	start := func(ctx context.Context, l payment.Ledger) (idempotency.Answer, error) {
		runs++
		if _, err := l.CreateAccount(ctx, merchant, payment.NewAccount{Currency: "USD"}); err != nil {
			return idempotency.Answer{}, err
		}
		return idempotency.Answer{Operation: op}, nil
	}

	first, err := s.Idempotent(ctx, req, start)
	if err != nil || first.Operation != op || first.Status != 0 || first.Replayed {
		t.Fatalf("first: %+v, %v; want bound to %v, no response, not replayed", first, err, op)
	}
	again, err := s.Idempotent(ctx, req, start)
	if err != nil || again.Operation != op || again.Status != 0 || !again.Replayed || runs != 1 {
		t.Fatalf("retry: %+v, %v after %d runs; want the operation %v replayed, the step run once", again, err, runs, op)
	}
	other := req
	other.Fingerprint = idempotency.Fingerprint{8}
	if _, err := s.Idempotent(ctx, other, start); !errors.Is(err, idempotency.ErrKeyReused) || runs != 1 {
		t.Fatalf("another request under the key: %v after %d runs; want ErrKeyReused, the step run once", err, runs)
	}
	account := payment.NewID()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, 'USD', 1000)`,
		merchant, account); err != nil {
		t.Fatal(err)
	}
	charge := chargedb.KeyedCharge{Request: other, Render: testkit.RenderCharge,
		Charge: payment.NewCharge{AccountID: account, Amount: 100, Currency: "USD"}}
	if _, err := s.CreateCharge(ctx, charge); !errors.Is(err, idempotency.ErrKeyReused) {
		t.Fatalf("an account charge under the key: %v, want ErrKeyReused", err)
	}

	// Days old and still bound: neither expired nor deleted.
	age := func(d time.Duration) {
		t.Helper()
		if _, err := s.Pool().Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - $2::interval WHERE merchant_id = $1`,
			merchant, d); err != nil {
			t.Fatal(err)
		}
	}
	age(72 * time.Hour)
	if n, ran, err := s.DeleteExpiredKeys(ctx, ttl, 100); err != nil || !ran || n != 0 {
		t.Fatalf("janitor: %d deleted (ran %v), %v; want a bound key kept", n, ran, err)
	}
	if res, err := s.Idempotent(ctx, req, start); err != nil || res.Operation != op || runs != 1 {
		t.Fatalf("retry of an old bound key: %+v, %v after %d runs; want still bound, the step run once", res, err, runs)
	}
	if _, err := s.CreateCharge(ctx, charge); !errors.Is(err, idempotency.ErrKeyReused) {
		t.Fatalf("an account charge under the old bound key: %v, want ErrKeyReused", err)
	}

	// The operation ends and stores the key's response, as its store does.
	body := []byte(`{"id":"ch_1","status":"succeeded"}` + "\n")
	if tag, err := s.Pool().Exec(ctx, `UPDATE idempotency_keys SET status = 201, location = '/v1/charges/ch_1', body = $3,
    body_encoding = NULL, created_at = clock_timestamp() WHERE merchant_id = $1 AND operation_id = $2 AND status IS NULL`,
		merchant, op, body); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("answer the key: %v, %v", tag, err)
	}
	replay, err := s.Idempotent(ctx, req, start)
	if err != nil || !replay.Replayed || replay.Operation != uuid.Nil || replay.Status != 201 ||
		string(replay.Body) != string(body) || replay.Location != "/v1/charges/ch_1" || runs != 1 {
		t.Fatalf("replay once answered: %+v, %v after %d runs; want the stored 201 byte for byte", replay, err, runs)
	}
	age(2 * ttl)
	if n, _, err := s.DeleteExpiredKeys(ctx, ttl, 100); err != nil || n != 1 {
		t.Fatalf("janitor after the answer: %d deleted, %v; want the answered key expired", n, err)
	}
	var accounts int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM accounts WHERE merchant_id = $1`, merchant).Scan(&accounts); err != nil || accounts != 2 {
		t.Errorf("%d accounts (%v), want 2: the step's and the fixture's", accounts, err)
	}
}

// TestDeferredStatementThatFailsWritesNothing: the statements of a keyed
// write whose answers nobody reads go with its COMMIT (keyTx.atCommit); one
// that fails there fails the write whole. A card charge whose row breaks a
// constraint leaves no charge, no operation, no event and no key, and the
// key is free: the same request, corrected, then charges.
func TestDeferredStatementThatFailsWritesNothing(t *testing.T) {
	ctx := context.Background()
	s := testkit.OpenService(t, pgtest.NewDatabase(t), postgres.Options{}, charging.Options{})
	merchant, _, err := s.RegisterMerchant(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	keys := idempotency.NewKeys[carddb.Tx](s.Cards, idempotency.KeysOptions{TTL: time.Hour})
	req := idempotency.Request{MerchantID: merchant, Key: "card", Fingerprint: idempotency.Fingerprint{9}}
	start := func(method string) idempotency.Step[carddb.Tx] {
		return func(ctx context.Context, tx carddb.Tx) (idempotency.Answer, error) {
			id := payment.NewID()
			ch := payment.Charge{ID: id, PaymentMethod: method, Amount: 100, Currency: "EUR", Status: payment.ChargeProcessing,
				Metadata: map[string]string{}}
			at, err := tx.InsertCharge(ctx, merchant, ch)
			if err != nil {
				return idempotency.Answer{}, err
			}
			op := carddb.Operation{Merchant: merchant, ID: id, ChargeID: id, Kind: carddb.KindAuthorize, State: carddb.Processing,
				Processor: "test", ProcessorKey: "k-" + id.String(), Amount: 100, Currency: "EUR", PaymentMethod: method,
				Capture: true, CreatedAt: at}
			err = tx.InsertOperation(ctx, carddb.Start{Op: op, DecisionAfter: time.Minute, CheckAfter: time.Minute,
				Event: carddb.Event{ID: payment.NewID(), Type: payment.EventChargeProcessing, Payload: []byte(`{}`)}})
			return idempotency.Answer{Operation: id}, err
		}
	}
	count := func() (charges, ops, events, keys int) {
		t.Helper()
		err := s.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1),
			(SELECT count(*) FROM processor_operations WHERE merchant_id = $1),
			(SELECT count(*) FROM events WHERE merchant_id = $1),
			(SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1)`, merchant).Scan(&charges, &ops, &events, &keys)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if _, err := keys.Idempotent(ctx, req, start("not a payment method")); err == nil {
		t.Fatal("a charge breaking the payment method's check was written")
	}
	if c, o, e, k := count(); c+o+e+k != 0 {
		t.Fatalf("after the failed write: %d charges, %d operations, %d events, %d keys; want none", c, o, e, k)
	}
	res, err := keys.Idempotent(ctx, req, start("pm_card_approve"))
	if err != nil || res.Operation == uuid.Nil || res.Replayed {
		t.Fatalf("the same request, corrected: %+v, %v; want it executed, bound to its operation", res, err)
	}
	if c, o, e, k := count(); c != 1 || o != 1 || e != 1 || k != 1 {
		t.Fatalf("after the write: %d charges, %d operations, %d events, %d keys; want 1 each", c, o, e, k)
	}
}
