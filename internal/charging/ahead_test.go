package charging_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestAheadIsCheckedNotTrusted: a batch decided ahead against this process's
// book of accounts commits only when the database finds every premise true;
// when another writer changed the balance, made a hold, or stored the key,
// the database refuses it, nothing of it is written, and the batch is decided
// again under its locks, with the answer and the money of a charge run alone.
func TestAheadIsCheckedNotTrusted(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s, other := open(t, url), open(t, url) // two replicas
	merchant, _, err := s.RegisterMerchant(ctx, "ahead")
	if err != nil {
		t.Fatal(err)
	}
	a, b := usdAccount(t, s, merchant, 100), usdAccount(t, s, merchant, 100)
	request := func(acct uuid.UUID, amount int64, authorize bool) chargedb.KeyedCharge {
		req := freshCharge(merchant, acct, amount)
		req.Charge.Authorize = authorize
		return req
	}
	charge := func(step string, req chargedb.KeyedCharge, wantStatus int, wantReplayed bool, wantAhead, wantRefused uint64, wantBalance int64) []byte {
		t.Helper()
		got, err := s.RunChargeBatch(ctx, []chargedb.KeyedCharge{req})
		if err != nil || got[0].Err != nil || got[0].Busy || got[0].InFlight {
			t.Fatalf("%s: %v %+v", step, err, got)
		}
		if got[0].Result.Status != wantStatus || got[0].Result.Replayed != wantReplayed {
			t.Fatalf("%s: status %d replayed %t, want %d %t", step, got[0].Result.Status, got[0].Result.Replayed, wantStatus, wantReplayed)
		}
		if ahead, refused := s.AheadStats(); ahead != wantAhead || refused != wantRefused {
			t.Fatalf("%s: %d batches committed ahead, %d refused; want %d, %d", step, ahead, refused, wantAhead, wantRefused)
		}
		var balance int64
		if err := s.Pool().QueryRow(ctx, `SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2`, merchant, req.Charge.AccountID).Scan(&balance); err != nil {
			t.Fatal(err)
		}
		if balance != wantBalance {
			t.Fatalf("%s: balance %d, want %d", step, balance, wantBalance)
		}
		return got[0].Result.Body
	}

	charge("first charge (locks and reads; the book learns the account)", request(a, 10, false), http.StatusCreated, false, 0, 0, 90)
	body := charge("second charge (decided ahead)", request(a, 10, false), http.StatusCreated, false, 1, 0, 80)
	// Its row and its event carry the clock its response says.
	var c struct {
		ID        string    `json:"id"`
		CreatedAt time.Time `json:"created_at"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	var rowAt, eventAt time.Time
	if err := s.Pool().QueryRow(ctx, `
SELECT c.created_at, e.created_at FROM charges c JOIN events e ON e.merchant_id = c.merchant_id AND e.aggregate_id = c.id
WHERE c.merchant_id = $1 AND c.id = $2`, merchant, uuid.MustParse(strings.TrimPrefix(c.ID, payment.PrefixCharge))).Scan(&rowAt, &eventAt); err != nil {
		t.Fatal(err)
	}
	if !rowAt.Equal(c.CreatedAt) || !eventAt.Equal(c.CreatedAt) {
		t.Fatalf("the charge says created_at %v; its row %v, its event %v", c.CreatedAt, rowAt, eventAt)
	}

	if _, err := s.Pool().Exec(ctx, `UPDATE accounts SET balance = 50 WHERE merchant_id = $1 AND id = $2`, merchant, a); err != nil {
		t.Fatal(err)
	}
	charge("after another writer took the balance to 50 (refused, then decided on 50)", request(a, 60, false), http.StatusPaymentRequired, false, 1, 1, 50)
	charge("the batch after a refusal (the book sits it out)", request(a, 3, false), http.StatusCreated, false, 1, 1, 47)
	charge("on the balance read under lock (ahead again)", request(a, 1, false), http.StatusCreated, false, 2, 1, 46)

	stored := request(b, 1, false) // another replica stores the key
	if got, err := other.RunChargeBatch(ctx, []chargedb.KeyedCharge{stored}); err != nil || got[0].Result.Status != http.StatusCreated {
		t.Fatalf("the other replica's charge: %v %+v", err, got)
	}
	stored.Charge.AccountID = a // the same key and fingerprint, on an account the book holds
	charge("a key another replica stored (refused, then replayed)", stored, http.StatusCreated, true, 2, 2, 46)

	// The replay locked no account, and the refusal made the book forget a.
	charge("the book learns the account again (locks and reads)", request(a, 1, false), http.StatusCreated, false, 2, 2, 45)
	charge("the batch after a refusal (the book sits it out)", request(a, 1, false), http.StatusCreated, false, 2, 2, 44)
	if got, err := other.RunChargeBatch(ctx, []chargedb.KeyedCharge{request(a, 44, true)}); err != nil || got[0].Result.Status != http.StatusCreated {
		t.Fatalf("the other replica's authorization: %v %+v", err, got)
	}
	charge("after a hold made elsewhere (refused, then decided on what the hold leaves)", request(a, 1, false), http.StatusPaymentRequired, false, 2, 3, 44)
	charge("an account with holds is never decided ahead", request(a, 1, false), http.StatusPaymentRequired, false, 2, 3, 44)

	charge("b: the book learns it", request(b, 1, false), http.StatusCreated, false, 2, 3, 98)
	// Two refusals in a row (the stored key, the hold): two batches sit out.
	charge("b: the first batch the book sits out", request(b, 1, false), http.StatusCreated, false, 2, 3, 97)
	charge("b: the second", request(b, 1, false), http.StatusCreated, false, 2, 3, 96)
	if _, err := s.Pool().Exec(ctx, `UPDATE accounts SET currency = 'EUR' WHERE merchant_id = $1 AND id = $2`, merchant, b); err != nil {
		t.Fatal(err)
	}
	charge("b in another currency (refused, then refused as a mismatch)", request(b, 1, false), http.StatusUnprocessableEntity, false, 2, 4, 96)

	var charges, events, keys int
	if err := s.Pool().QueryRow(ctx, `
SELECT (SELECT count(*) FROM charges WHERE merchant_id = $1), (SELECT count(*) FROM events WHERE merchant_id = $1),
       (SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1)`, merchant).Scan(&charges, &events, &keys); err != nil {
		t.Fatal(err)
	}
	// 10, 10, the failed 60, 3, 1, the other's 1 on b, 1, 1, the other's
	// hold, two failed 1s, three 1s on b; and the key of the currency mismatch.
	if charges != 14 || events != 14 || keys != 15 {
		t.Fatalf("%d charges, %d events, %d keys; want 14, 14, 15", charges, events, keys)
	}
}

// TestAheadBacksOffFromAnotherWriter: two replicas charging one account in
// turn each find their book wrong every time, and a refusal costs a round
// trip, so after refusals the book sits out batches (twice as many after each
// refusal in a row): 100 charges each pay for a handful of refusals, not for
// 99, and the money is exact.
func TestAheadBacksOffFromAnotherWriter(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s, other := open(t, url), open(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "backoff")
	if err != nil {
		t.Fatal(err)
	}
	acct := usdAccount(t, s, merchant, 1000)
	const rounds = 100
	for i := range rounds {
		for _, p := range []interface {
			RunChargeBatch(context.Context, []chargedb.KeyedCharge) ([]charging.BatchAnswer, error)
		}{s, other} {
			got, err := p.RunChargeBatch(ctx, []chargedb.KeyedCharge{freshCharge(merchant, acct, 1)})
			if err != nil || got[0].Err != nil || got[0].Result.Status != http.StatusCreated {
				t.Fatalf("round %d: %v %+v", i, err, got)
			}
		}
	}
	var balance int64
	if err := s.Pool().QueryRow(ctx, `SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2`, merchant, acct).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 1000-2*rounds {
		t.Fatalf("balance %d, want %d", balance, 1000-2*rounds)
	}
	for name, p := range map[string]interface{ AheadStats() (uint64, uint64) }{"s": s, "other": other} {
		committed, refused := p.AheadStats()
		t.Logf("replica %s: %d batches committed ahead, %d refused", name, committed, refused)
		if committed != 0 || refused == 0 || refused > 8 {
			t.Errorf("replica %s: %d batches committed ahead and %d refused; want none committed (the other replica always changed the account) and 1 to 8 refused (backing off), not one a batch",
				name, committed, refused)
		}
	}
}

// TestAheadTakesTheDatabasesClock: a batch decided ahead carries the
// database's clock as this process last read it, not its host's, so a
// service whose host's clock is seconds ahead of the database's (or behind
// it) still decides ahead, and its charges' created_at lies between the
// database's clock before and after the charge.
func TestAheadTakesTheDatabasesClock(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	for _, skew := range []time.Duration{3 * time.Second, -3 * time.Second} {
		s := open(t, url)
		s.SkewClock(skew)
		merchant, _, err := s.RegisterMerchant(ctx, "clock")
		if err != nil {
			t.Fatal(err)
		}
		acct := usdAccount(t, s, merchant, 100)
		for i := range 3 {
			var before, after time.Time
			if err := s.Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			got, err := s.RunChargeBatch(ctx, []chargedb.KeyedCharge{freshCharge(merchant, acct, 1)})
			if err != nil || got[0].Err != nil || got[0].Result.Status != http.StatusCreated {
				t.Fatalf("skew %v, charge %d: %v %+v", skew, i, err, got)
			}
			if err := s.Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after); err != nil {
				t.Fatal(err)
			}
			var c struct {
				CreatedAt time.Time `json:"created_at"`
			}
			if err := json.Unmarshal(got[0].Result.Body, &c); err != nil {
				t.Fatal(err)
			}
			if c.CreatedAt.Before(before.Add(-time.Second)) || c.CreatedAt.After(after) {
				t.Errorf("skew %v, charge %d: created_at %v, want between %v (less a second) and %v, the database's clock around it",
					skew, i, c.CreatedAt, before, after)
			}
		}
		if ahead, refused := s.AheadStats(); ahead != 2 || refused != 0 {
			t.Errorf("skew %v: %d batches committed ahead, %d refused; want the 2 after the first, none refused", skew, ahead, refused)
		}
	}
}

// freshCharge is a charge of amount USD on acct under a new key, with a
// fingerprint of its own.
func freshCharge(merchant, acct uuid.UUID, amount int64) chargedb.KeyedCharge {
	var fp idempotency.Fingerprint
	copy(fp[:], uuid.NewString())
	return chargedb.KeyedCharge{
		Request: idempotency.Request{MerchantID: merchant, Key: uuid.NewString(), Fingerprint: fp},
		Charge:  payment.NewCharge{AccountID: acct, Amount: amount, Currency: "USD"},
		Render:  render,
	}
}

// TestAheadWaitsForNoLockHeldElsewhere: the statement that writes a batch
// decided ahead updates its accounts and takes its keys' locks itself, so
// where another transaction holds an account's row or a key's lock it must
// not wait for that transaction to end. Each holder here stays open until
// the batch has answered: the batch is refused (its wait cut short, or the
// key found in flight), writes nothing, and runs the usual way, which finds
// the account busy or the key in flight, and the money does not move.
func TestAheadWaitsForNoLockHeldElsewhere(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a batch that waited for its holder would wait for good
	defer cancel()
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	acct := usdAccount(t, s, merchant, 100)
	run := func(step string, req chargedb.KeyedCharge, wantAhead, wantRefused uint64) charging.BatchAnswer {
		t.Helper()
		got, err := s.RunChargeBatch(ctx, []chargedb.KeyedCharge{req})
		if err != nil || got[0].Err != nil {
			t.Fatalf("%s: %v %+v", step, err, got)
		}
		if ahead, refused := s.AheadStats(); ahead != wantAhead || refused != wantRefused {
			t.Fatalf("%s: %d batches committed ahead, %d refused; want %d, %d", step, ahead, refused, wantAhead, wantRefused)
		}
		return got[0]
	}
	// hold begins a transaction on a connection of its own that takes lock
	// and keeps it until release.
	hold := func(lock string, args ...any) (release func()) {
		t.Helper()
		tx, err := testkit.Connect(t, url).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, lock, args...); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	run("the book learns the account", freshCharge(merchant, acct, 1), 0, 0)
	release := hold(`SELECT FROM accounts WHERE merchant_id = $1 AND id = $2 FOR UPDATE`, merchant, acct)
	if got := run("the account's row held elsewhere (refused, then busy)", freshCharge(merchant, acct, 1), 0, 1); !got.Busy {
		t.Fatalf("the account's row held elsewhere: %+v, want the member busy", got)
	}
	release()
	run("the book learns the account again", freshCharge(merchant, acct, 1), 0, 1)
	run("the batch after a refusal (the book sits it out)", freshCharge(merchant, acct, 1), 0, 1)
	run("ahead again", freshCharge(merchant, acct, 1), 1, 1)

	inFlight := freshCharge(merchant, acct, 1)
	release = hold(`SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`, merchant, inFlight.Request.Key)
	if got := run("its key's lock held elsewhere (refused, then in flight)", inFlight, 1, 2); !got.InFlight {
		t.Fatalf("its key's lock held elsewhere: %+v, want the member in flight", got)
	}
	release()

	var balance int64
	var charges, keys int
	if err := s.Pool().QueryRow(ctx, `
SELECT (SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2),
       (SELECT count(*) FROM charges WHERE merchant_id = $1), (SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1)`,
		merchant, acct).Scan(&balance, &charges, &keys); err != nil {
		t.Fatal(err)
	}
	if balance != 96 || charges != 4 || keys != 4 {
		t.Fatalf("balance %d, %d charges, %d keys; want 96, 4, 4 (the charges whose batches committed)", balance, charges, keys)
	}
}
