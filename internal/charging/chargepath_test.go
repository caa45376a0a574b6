package charging_test

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

// chargeFixture is a store and its charge path on a database of its own
// with one funded account.
func chargeFixture(t *testing.T, opts postgres.Options) (s testkit.Service, url string, merchant, account uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	url = pgtest.NewDatabase(t)
	s = testkit.OpenService(t, url, opts, charging.Options{})
	var err error
	if merchant, _, err = s.RegisterMerchant(ctx, t.Name()); err != nil {
		t.Fatal(err)
	}
	return s, url, merchant, usdAccount(t, s, merchant, 10000)
}

func newCharge(merchant, account uuid.UUID, amount int64) chargedb.KeyedCharge {
	return chargedb.KeyedCharge{
		Request: idempotency.Request{MerchantID: merchant, Key: "k-" + uuid.NewString(), Fingerprint: idempotency.Fingerprint{byte(amount)}},
		Charge:  payment.NewCharge{AccountID: account, Amount: amount, Currency: "USD"},
		Render:  render,
	}
}

// counts returns the merchant's charges and keys and the account's balance.
func counts(t *testing.T, s testkit.Service, merchant, account uuid.UUID) (charges, keys, balance int64) {
	t.Helper()
	if err := s.Pool().QueryRow(context.Background(), `
SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1), (SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1),
       (SELECT balance FROM accounts WHERE id = $2)`, merchant, account).Scan(&charges, &keys, &balance); err != nil {
		t.Fatal(err)
	}
	return charges, keys, balance
}

// TestChargeRetriesBoundedly: a batch that hits a serialization failure every
// time runs exactly maxAttempts (3) times and then fails, having written
// nothing; one whose failure is not retryable runs once. A trigger raises the
// failure and counts the attempts in a sequence, which no rollback undoes.
func TestChargeRetriesBoundedly(t *testing.T) {
	ctx := context.Background()
	s, _, merchant, account := chargeFixture(t, postgres.Options{})
	if _, err := s.Pool().Exec(ctx, `
CREATE SEQUENCE attempts;
CREATE TABLE fail_with (code text);
CREATE FUNCTION fail_charge() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE c text;
BEGIN
    PERFORM nextval('attempts');
    SELECT code INTO c FROM fail_with;
    RAISE EXCEPTION 'planted failure' USING ERRCODE = c;
END $$;
CREATE TRIGGER fail_charge BEFORE INSERT ON charges FOR EACH ROW EXECUTE FUNCTION fail_charge();`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		code     string
		attempts int64
	}{
		{"40001", 3}, // serialization_failure: run again, up to maxAttempts
		{"40P01", 3}, // deadlock_detected: likewise
		{"22000", 1}, // data_exception: not retried
	} {
		if _, err := s.Pool().Exec(ctx, `DELETE FROM fail_with; INSERT INTO fail_with VALUES ('`+tc.code+`'); SELECT setval('attempts', 1, false)`); err != nil {
			t.Fatal(err)
		}
		for _, run := range []func(chargedb.KeyedCharge) error{
			func(r chargedb.KeyedCharge) error { _, err := s.CreateCharge(ctx, r); return err },
			func(r chargedb.KeyedCharge) error {
				_, err := s.RunChargeBatch(ctx, []chargedb.KeyedCharge{r})
				return err
			},
		} {
			if _, err := s.Pool().Exec(ctx, `SELECT setval('attempts', 1, false)`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- run(newCharge(merchant, account, 100)) }()
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("%s: a charge whose every attempt failed succeeded", tc.code)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: still retrying after 30 s", tc.code)
			}
			var attempts int64
			if err := s.Pool().QueryRow(ctx, `SELECT last_value FROM attempts`).Scan(&attempts); err != nil {
				t.Fatal(err)
			}
			if attempts != tc.attempts {
				t.Errorf("%s: %d attempts, want %d", tc.code, attempts, tc.attempts)
			}
		}
	}
	if charges, keys, balance := counts(t, s, merchant, account); charges != 0 || keys != 0 || balance != 10000 {
		t.Errorf("after the failures: %d charges, %d keys, balance %d; want 0, 0, 10000", charges, keys, balance)
	}
}

// TestFailedCommitIsAnError: when the commit of a batch fails (here a
// deferred trigger raises at COMMIT), the charge is an error, not a success,
// and nothing is written.
func TestFailedCommitIsAnError(t *testing.T) {
	ctx := context.Background()
	s, _, merchant, account := chargeFixture(t, postgres.Options{})
	if _, err := s.Pool().Exec(ctx, `
CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'planted commit failure' USING ERRCODE = '22000'; END $$;
CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON charges
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit();`); err != nil {
		t.Fatal(err)
	}
	res, err := s.CreateCharge(ctx, newCharge(merchant, account, 100))
	if err == nil {
		t.Fatalf("a charge whose commit failed: %+v, no error", res)
	}
	if charges, keys, balance := counts(t, s, merchant, account); charges != 0 || keys != 0 || balance != 10000 {
		t.Errorf("after the failed commit: %d charges, %d keys, balance %d; want 0, 0, 10000", charges, keys, balance)
	}
}

// TestChargeStoredAt: a charge's result carries the time its response was
// stored, and a replay from the database carries the original's, not the
// replaying transaction's; a charge under an expired key (deleted in the same
// batch) carries its new time.
func TestChargeStoredAt(t *testing.T) {
	ctx := context.Background()
	s, _, merchant, account := chargeFixture(t, postgres.Options{KeyTTL: time.Hour})
	req := newCharge(merchant, account, 100)
	first, err := s.CreateCharge(ctx, req)
	if err != nil || first.StoredAt.IsZero() {
		t.Fatalf("first: %+v, %v", first, err)
	}
	time.Sleep(20 * time.Millisecond)
	// In a batch with a fresh charge, so that the batch stores a time too.
	got, err := s.RunChargeBatch(ctx, []chargedb.KeyedCharge{req, newCharge(merchant, account, 50)})
	if err != nil {
		t.Fatal(err)
	}
	if r := got[0].Result; !r.Replayed || !r.StoredAt.Equal(first.StoredAt) {
		t.Errorf("replay: replayed %v, stored at %v; want the original's %v", r.Replayed, r.StoredAt, first.StoredAt)
	}
	if r := got[1].Result; r.StoredAt.IsZero() || !r.StoredAt.After(first.StoredAt) {
		t.Errorf("the fresh charge beside it: stored at %v, want after %v", r.StoredAt, first.StoredAt)
	}

	// Age the key past the retention: its next request executes afresh, in
	// the batch that deletes the old row.
	if _, err := s.Pool().Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 hours' WHERE key = $1`, req.Request.Key); err != nil {
		t.Fatal(err)
	}
	again, err := s.CreateCharge(ctx, req)
	if err != nil || again.Replayed || again.StoredAt.IsZero() || !again.StoredAt.After(first.StoredAt) {
		t.Fatalf("after expiry: %+v, %v; want a fresh execution stored now", again, err)
	}
	if charges, keys, _ := counts(t, s, merchant, account); charges != 3 || keys != 2 {
		t.Errorf("%d charges and %d keys, want 3 and 2", charges, keys)
	}
}

// TestExpiredKeyExecutesAgain: through Idempotent (deposits, refunds,
// accounts), a key older than the retention is deleted and its request
// executes afresh, counted as expired; a live key replays.
func TestExpiredKeyExecutesAgain(t *testing.T) {
	ctx := context.Background()
	var expired int
	s, _, merchant, account := chargeFixture(t, postgres.Options{KeyTTL: time.Hour})
	s.Keys = idempotency.NewKeys(s.Store.Keys, idempotency.KeysOptions{TTL: time.Hour, OnExpired: func() { expired++ }})
	req := idempotency.Request{MerchantID: merchant, Key: "deposit-" + uuid.NewString(), Fingerprint: idempotency.Fingerprint{9}}
	deposit := func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
		d, err := l.Deposit(ctx, merchant, account, 10)
		return idempotency.Response{Status: 201, Body: []byte(`"` + d.ID.String() + `"`)}, err
	}
	first, err := s.Execute(ctx, req, deposit)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v, %v", first, err)
	}
	if res, err := s.Execute(ctx, req, deposit); err != nil || !res.Replayed || string(res.Body) != string(first.Body) {
		t.Fatalf("replay: %+v, %v; want the first's body replayed", res, err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 hours' WHERE key = $1`, req.Key); err != nil {
		t.Fatal(err)
	}
	again, err := s.Execute(ctx, req, deposit)
	if err != nil || again.Replayed || again.Status != 201 || string(again.Body) == string(first.Body) || expired != 1 {
		t.Fatalf("after expiry: %+v, %v (%d expired); want a new deposit, counted as expired once", again, err, expired)
	}
	var deposits int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM deposits WHERE merchant_id = $1`, merchant).Scan(&deposits); err != nil || deposits != 2 {
		t.Errorf("%d deposits (%v), want 2", deposits, err)
	}
}
