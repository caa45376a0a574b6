package charging

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// The decision without a database: decideBatch answers a batch's members
// from what a first round trip found (chargedb.Locks, written here by hand),
// and gathers what the batch writes. The same decisions against PostgreSQL
// are charges_test.go's and isolation_test.go's.

// decideRender renders a decided charge by status alone: 201, 402 for a
// failed one, 404 and 422 for a refusal.
func decideRender(c payment.Charge, body []byte, err error) (idempotency.Response, error) {
	switch {
	case errors.Is(err, payment.ErrAccountNotFound):
		return idempotency.Response{Status: http.StatusNotFound}, nil
	case errors.Is(err, payment.ErrCurrencyMismatch):
		return idempotency.Response{Status: http.StatusUnprocessableEntity}, nil
	case err != nil:
		return idempotency.Response{}, err
	case c.Status == payment.ChargeFailed:
		return idempotency.Response{Status: http.StatusPaymentRequired}, nil
	}
	return idempotency.Response{Status: http.StatusCreated, Body: body}, nil
}

var (
	decideMerchant = uuid.MustParse("00000000-0000-0000-0000-00000000000a")
	decideNow      = time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
)

func decideCharge(key string, fp byte, account uuid.UUID, amount int64) chargedb.KeyedCharge {
	return chargedb.KeyedCharge{
		Request: idempotency.Request{MerchantID: decideMerchant, Key: key, Fingerprint: idempotency.Fingerprint{fp}},
		Charge:  payment.NewCharge{AccountID: account, Amount: amount, Currency: "USD"},
		Render:  decideRender,
	}
}

// locksFor is what round trip 1 finds for reqs when every key is free and
// unstored, and accounts holds every account this transaction locked.
func locksFor(reqs []chargedb.KeyedCharge, accounts ...*payment.Account) *chargedb.Locks {
	l := &chargedb.Locks{KeyHeld: make([]bool, len(reqs)), Stored: make([]chargedb.StoredKey, len(reqs)), Now: decideNow,
		Accounts: map[chargedb.AccountKey]*payment.Account{}, Busy: map[chargedb.AccountKey]bool{}}
	for i := range reqs {
		l.KeyHeld[i] = true
	}
	for _, a := range accounts {
		l.Accounts[chargedb.AccountKey{Merchant: a.MerchantID, ID: a.ID}] = a
	}
	return l
}

func usd(balance int64) *payment.Account {
	return &payment.Account{MerchantID: decideMerchant, ID: payment.NewID(), Currency: "USD", Balance: balance}
}

// TestDecideInOrderAgainstTheBalance: members are decided in batch order
// against what the members before them left; an account's debits are one
// row; a failed charge is written without a debit; an unknown account and a
// currency mismatch are refusals, stored under their keys with no charge.
func TestDecideInOrderAgainstTheBalance(t *testing.T) {
	a, eur := usd(100), usd(1_000)
	eur.Currency = "EUR"
	unknown := payment.NewID()
	reqs := []chargedb.KeyedCharge{
		decideCharge("k1", 1, a.ID, 60),
		decideCharge("k2", 2, a.ID, 60), // 40 left: insufficient funds
		decideCharge("k3", 3, a.ID, 30),
		decideCharge("k4", 4, unknown, 10),
		decideCharge("k5", 5, eur.ID, 10),
	}
	answers, decided, w := decideBatch(reqs, locksFor(reqs, a, eur), time.Hour)
	want := []int{http.StatusCreated, http.StatusPaymentRequired, http.StatusCreated, http.StatusNotFound, http.StatusUnprocessableEntity}
	for i, ans := range answers {
		if ans.err != nil || ans.left() || ans.res.Replayed || ans.res.Status != want[i] || !decided[i] {
			t.Errorf("member %d: %+v (decided %v), want a fresh %d", i, ans, decided[i], want[i])
		}
	}
	if a.Balance != 10 {
		t.Errorf("balance after the batch's decisions: %d, want 10", a.Balance)
	}
	if len(w.Debits) != 1 || w.Debits[0].Amount != 90 || w.Debits[0].Account.ID != a.ID {
		t.Errorf("debits %+v, want one of 90 on the account", w.Debits)
	}
	if len(w.Charges) != 3 || w.Charges[1].Charge.Status != payment.ChargeFailed || w.Charges[1].EventType != payment.EventChargeFailed ||
		w.Charges[0].EventType != payment.EventChargeSucceeded || w.Charges[0].Charge.CreatedAt != decideNow {
		t.Errorf("charges %+v, want succeeded, failed, succeeded at the transaction's clock", w.Charges)
	}
	if len(w.Keys) != 5 || len(w.Expired) != 0 || w.ConfirmReplays {
		t.Errorf("%d key rows, %d expired, confirm %v; want 5, 0, false", len(w.Keys), len(w.Expired), w.ConfirmReplays)
	}
}

// TestDecideReplaysStoredKeys: a stored key is replayed (its commit then
// confirms it) or refused as reused, and touches nothing; an expired one is
// deleted and executes afresh.
func TestDecideReplaysStoredKeys(t *testing.T) {
	a := usd(100)
	reqs := []chargedb.KeyedCharge{decideCharge("stored", 1, a.ID, 10), decideCharge("reused", 2, a.ID, 10), decideCharge("expired", 3, a.ID, 10)}
	locks := locksFor(reqs, a)
	storedAt := decideNow.Add(-time.Minute)
	locks.Stored[0] = chargedb.StoredKey{Found: true, Fingerprint: []byte{1, 31: 0}, Resp: idempotency.Response{Status: 201, Body: []byte("{}")}, StoredAt: storedAt}
	locks.Stored[1] = chargedb.StoredKey{Found: true, Fingerprint: make([]byte, 32), Resp: idempotency.Response{Status: 201}, StoredAt: storedAt}
	locks.Stored[2] = chargedb.StoredKey{Found: true, Expired: true}
	answers, decided, w := decideBatch(reqs, locks, time.Hour)
	if r := answers[0]; r.err != nil || !r.res.Replayed || r.res.Status != 201 || !r.res.StoredAt.Equal(storedAt) || decided[0] {
		t.Errorf("stored key: %+v, decided %v; want its 201 replayed with its time, not decided here", r, decided[0])
	}
	if r := answers[1]; !errors.Is(r.err, idempotency.ErrKeyReused) || decided[1] {
		t.Errorf("reused key: %+v, want ErrKeyReused", r)
	}
	if r := answers[2]; r.err != nil || r.res.Replayed || r.res.Status != 201 || !decided[2] {
		t.Errorf("expired key: %+v, want a fresh 201", r)
	}
	if !w.ConfirmReplays || len(w.Expired) != 1 || w.Expired[0].Key != "expired" || len(w.Keys) != 1 || len(w.Charges) != 1 || a.Balance != 90 {
		t.Errorf("writes %+v, balance %d; want the replay confirmed, the expired key deleted and executed once", w.Writes, a.Balance)
	}
}

// TestDecideSameKeyTwice: a key a batch's earlier member executed answers
// its later members as a replay of that answer (or as reused), once.
func TestDecideSameKeyTwice(t *testing.T) {
	a := usd(100)
	reqs := []chargedb.KeyedCharge{decideCharge("twice", 1, a.ID, 10), decideCharge("twice", 1, a.ID, 10), decideCharge("twice", 2, a.ID, 10)}
	answers, decided, w := decideBatch(reqs, locksFor(reqs, a), time.Hour)
	if r := answers[0]; r.err != nil || r.res.Replayed || r.res.Status != 201 {
		t.Errorf("first: %+v, want a fresh 201", r)
	}
	if r := answers[1]; r.err != nil || !r.res.Replayed || r.res.Status != 201 || string(r.res.Body) != string(answers[0].res.Body) || !decided[1] {
		t.Errorf("twin: %+v, want the first's 201 replayed", r)
	}
	if r := answers[2]; !errors.Is(r.err, idempotency.ErrKeyReused) {
		t.Errorf("other fingerprint: %+v, want ErrKeyReused", r)
	}
	if len(w.Charges) != 1 || len(w.Keys) != 1 || a.Balance != 90 {
		t.Errorf("%d charges, %d key rows, balance %d; want 1, 1, 90", len(w.Charges), len(w.Keys), a.Balance)
	}
}

// TestDecideLeavers: a member whose key another transaction holds, or whose
// account another transaction holds, leaves the batch untouched, and so does
// a later member with the key of one that left; the others are decided.
func TestDecideLeavers(t *testing.T) {
	free, busy := usd(100), usd(100)
	reqs := []chargedb.KeyedCharge{
		decideCharge("held", 1, free.ID, 10),
		decideCharge("busy", 2, busy.ID, 10),
		decideCharge("busy", 2, busy.ID, 10),
		decideCharge("free", 3, free.ID, 10),
	}
	locks := locksFor(reqs, free)
	locks.KeyHeld[0] = false
	locks.Busy[chargedb.AccountKey{Merchant: decideMerchant, ID: busy.ID}] = true
	answers, decided, w := decideBatch(reqs, locks, time.Hour)
	if r := answers[0]; !r.inFlight || r.busy || decided[0] {
		t.Errorf("key held elsewhere: %+v, want in flight", r)
	}
	if r := answers[1]; !r.busy || r.inFlight || decided[1] {
		t.Errorf("account held elsewhere: %+v, want busy", r)
	}
	if r := answers[2]; !r.inFlight || decided[2] {
		t.Errorf("the key of a member that left: %+v, want in flight behind it", r)
	}
	if r := answers[3]; r.err != nil || r.left() || r.res.Status != 201 || !decided[3] {
		t.Errorf("free member: %+v, want a fresh 201", r)
	}
	if len(w.Charges) != 1 || len(w.Keys) != 1 || len(w.Debits) != 1 || free.Balance != 90 || busy.Balance != 100 {
		t.Errorf("writes %+v; want only the free member's", w.Writes)
	}
}

// TestDecideFailedRenderTakesNothing: a member whose answer cannot be
// rendered fails alone and writes nothing, so the members after it on its
// account are decided against the balance as if it had never come: its
// amount is not taken from what they see, nor from the account the batch
// leaves (which a batch decided ahead records in its book).
func TestDecideFailedRenderTakesNothing(t *testing.T) {
	a := usd(100)
	broken := decideCharge("broken", 1, a.ID, 60)
	broken.Render = func(payment.Charge, []byte, error) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("cannot render")
	}
	reqs := []chargedb.KeyedCharge{broken, decideCharge("after", 2, a.ID, 60)}
	answers, _, w := decideBatch(reqs, locksFor(reqs, a), time.Hour)
	if answers[0].err == nil {
		t.Errorf("the broken member: %+v, want its render's error", answers[0])
	}
	if answers[1].err != nil || answers[1].res.Status != http.StatusCreated {
		t.Errorf("the member after it: %+v, want 201 against the whole balance", answers[1])
	}
	if a.Balance != 40 || len(w.Debits) != 1 || w.Debits[0].Amount != 60 || len(w.Charges) != 1 || len(w.Keys) != 1 {
		t.Errorf("balance %d, debits %+v, %d charges, %d keys; want 40, one of 60, 1, 1", a.Balance, w.Debits, len(w.Charges), len(w.Keys))
	}
}
