package charging_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// warnAtCommitSQL makes every commit that inserted a charge or a deposit send
// the WARNING PostgreSQL sends when a commit's wait for the synchronous
// standby is cancelled: the transaction commits, locally, and COMMIT reports
// success. A deferred constraint trigger runs inside COMMIT, as that wait does.
const warnAtCommitSQL = `
CREATE FUNCTION warn_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'canceling wait for synchronous replication due to user request'
        USING DETAIL = 'The transaction has already committed locally, but might not have been replicated to the standby.';
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER warn_at_commit AFTER INSERT ON charges
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION warn_at_commit();
CREATE CONSTRAINT TRIGGER warn_at_commit AFTER INSERT ON deposits
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION warn_at_commit();`

// TestUnconfirmedCommitIsNotAcknowledged: a charge (and a deposit, through
// Idempotent) whose commit ends with a WARNING is answered
// payment.ErrUnavailable, although it committed; its retry, once commits are
// confirmed again, replays the one charge it made.
func TestUnconfirmedCommitIsNotAcknowledged(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	account := usdAccount(t, s, merchant, 1000)
	if _, err := s.Pool().Exec(ctx, warnAtCommitSQL); err != nil {
		t.Fatal(err)
	}

	charge := chargedb.KeyedCharge{
		Request: idempotency.Request{MerchantID: merchant, Key: "charge-" + uuid.NewString(), Fingerprint: idempotency.Fingerprint{7}},
		Charge:  payment.NewCharge{AccountID: account, Amount: 300, Currency: "USD"},
		Render:  render,
	}
	// Alone and in a batch: both commit paths.
	if _, err := s.CreateCharge(ctx, charge); !errors.Is(err, payment.ErrUnavailable) {
		t.Fatalf("charge whose commit warned: %v, want %v", err, payment.ErrUnavailable)
	}
	second := charge
	second.Request.Key = "charge-" + uuid.NewString()
	if _, err := s.RunChargeBatch(ctx, []chargedb.KeyedCharge{second}); !errors.Is(err, payment.ErrUnavailable) {
		t.Fatalf("batch whose commit warned: %v, want %v", err, payment.ErrUnavailable)
	}
	deposit := idempotency.Request{MerchantID: merchant, Key: "deposit-" + uuid.NewString(), Fingerprint: idempotency.Fingerprint{8}}
	step := func(ctx context.Context, l payment.Ledger) (idempotency.Response, error) {
		d, err := l.Deposit(ctx, merchant, account, 50)
		return idempotency.Response{Status: 201, Body: []byte(`"` + d.ID.String() + `"`)}, err
	}
	if _, err := s.Execute(ctx, deposit, step); !errors.Is(err, payment.ErrUnavailable) {
		t.Fatalf("deposit whose commit warned: %v, want %v", err, payment.ErrUnavailable)
	}

	// They did commit, locally: that is the hazard.
	var charges, deposits, keys, balance int64
	if err := s.Pool().QueryRow(ctx, `
SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1), (SELECT count(*) FROM deposits WHERE merchant_id = $1),
       (SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1), (SELECT balance FROM accounts WHERE id = $2)`,
		merchant, account).Scan(&charges, &deposits, &keys, &balance); err != nil {
		t.Fatal(err)
	}
	if charges != 2 || deposits != 1 || keys != 3 || balance != 1000-300-300+50 {
		t.Fatalf("after the warned commits: %d charges, %d deposits, %d keys, balance %d; want 2, 1, 3, 450", charges, deposits, keys, balance)
	}

	// The standby caught up (no more warnings): the retries replay, and execute nothing.
	if _, err := s.Pool().Exec(ctx, `DROP FUNCTION warn_at_commit() CASCADE`); err != nil {
		t.Fatal(err)
	}
	for _, r := range []chargedb.KeyedCharge{charge, second} {
		res, err := s.CreateCharge(ctx, r)
		if err != nil || !res.Replayed || res.Status != 201 {
			t.Fatalf("retry of %s: %+v, %v; want a replayed 201", r.Request.Key, res, err)
		}
	}
	if res, err := s.Execute(ctx, deposit, step); err != nil || !res.Replayed {
		t.Fatalf("retry of the deposit: %+v, %v; want a replay", res, err)
	}
	if err := s.Pool().QueryRow(ctx, `
SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1), (SELECT count(*) FROM deposits WHERE merchant_id = $1),
       (SELECT balance FROM accounts WHERE id = $2)`, merchant, account).Scan(&charges, &deposits, &balance); err != nil {
		t.Fatal(err)
	}
	if charges != 2 || deposits != 1 || balance != 450 {
		t.Fatalf("after the retries: %d charges, %d deposits, balance %d; want 2, 1, 450", charges, deposits, balance)
	}
}
