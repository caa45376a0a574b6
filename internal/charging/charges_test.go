package charging_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// model executes charges one at a time, the way the contract describes them.
type model struct {
	balances map[uuid.UUID]int64
	currency map[uuid.UUID]string
	keys     map[string]modelKey
	charges  map[payment.ChargeStatus]int
}

type modelKey struct {
	fp     idempotency.Fingerprint
	status int
}

// answer is what one request got: a status, or an idempotency error, and
// whether it was a replay.
type answer struct {
	status   int
	replayed bool
	err      error
}

func (m *model) charge(r chargedb.KeyedCharge) answer {
	if k, ok := m.keys[r.Request.Key]; ok {
		if k.fp != r.Request.Fingerprint {
			return answer{err: idempotency.ErrKeyReused}
		}
		return answer{status: k.status, replayed: true}
	}
	var a *payment.Account
	if cur, ok := m.currency[r.Charge.AccountID]; ok {
		a = &payment.Account{ID: r.Charge.AccountID, Currency: cur, Balance: m.balances[r.Charge.AccountID]}
	}
	c, err := payment.ChargeAccount(a, payment.NewID(), r.Charge, time.Time{}, time.Hour)
	if err == nil && c.Amount == refusedAmount {
		return answer{err: errMemberFailed} // its insert fails: nothing is written
	}
	resp, _ := render(c, nil, err)
	if err == nil {
		m.charges[c.Status]++
		m.balances[a.ID] = a.Balance
	}
	m.keys[r.Request.Key] = modelKey{fp: r.Request.Fingerprint, status: resp.Status}
	return answer{status: resp.Status}
}

// refusedAmount is the amount whose charges a trigger refuses, as a member
// whose own statement fails; errMemberFailed is what such a member gets.
const refusedAmount = 199

var errMemberFailed = errors.New("the member's own statement failed")

// observed is what a member got, with any error but the key's own reduced
// to errMemberFailed.
func observed(res idempotency.Result, err error) answer {
	if err != nil && !errors.Is(err, idempotency.ErrKeyReused) && !errors.Is(err, idempotency.ErrKeyInUse) {
		err = errMemberFailed
	}
	return answer{status: res.Status, replayed: res.Replayed, err: err}
}

// TestBatchEqualsOneAtATime: random batches mixing every outcome (covered,
// not covered, unknown account, wrong currency, replay, reused key, the same
// key twice in the batch, many charges on one account, a member whose insert
// fails), now and then with one account's row locked by another transaction
// and one member's key held by a twin in flight, give each member exactly the
// answer, and leave exactly the balances, that executing them one at a time
// gives: the members that stay in the batch in its order, then those that
// left it (for the held key or account), in order, alone once the holder is
// gone. The batch itself waits for nothing the holder holds. Half the rounds
// are clean (no retries, no unknown accounts), so that their later batches
// are decided ahead against the book (ahead.go) and checked the same way,
// the database's refusals (a busy account, a key in flight) included.
func TestBatchEqualsOneAtATime(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	s := open(t, url)
	merchant, _, err := s.RegisterMerchant(ctx, "batch")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `
CREATE FUNCTION refuse_charge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'planted failure of one member' USING ERRCODE = '22000'; END $$;
CREATE TRIGGER refuse_charge BEFORE INSERT ON charges FOR EACH ROW WHEN (NEW.amount = `+strconv.Itoa(refusedAmount)+`)
    EXECUTE FUNCTION refuse_charge();`); err != nil {
		t.Fatal(err)
	}
	holderConn := testkit.Connect(t, url)
	var busy, inFlight, memberFailed int // what the rounds exercised
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 40 {
		// Four accounts: three in USD, one in EUR, with small balances so
		// that charges run out of money part way through a batch.
		m := &model{balances: map[uuid.UUID]int64{}, currency: map[uuid.UUID]string{}, keys: map[string]modelKey{},
			charges: map[payment.ChargeStatus]int{}}
		var accounts []uuid.UUID
		for _, cur := range []string{"USD", "USD", "USD", "EUR"} {
			id := payment.NewID()
			balance := int64(rng.IntN(500))
			if _, err := s.Pool().Exec(ctx, `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, $3, $4)`,
				merchant, id, cur, balance); err != nil {
				t.Fatal(err)
			}
			m.balances[id], m.currency[id] = balance, cur
			accounts = append(accounts, id)
		}
		// A clean round has no retries and no unknown accounts: after its
		// first batch, its batches can be decided ahead (ahead.go).
		clean := round%2 == 1
		var used []chargedb.KeyedCharge
		newRequest := func() chargedb.KeyedCharge {
			var fp idempotency.Fingerprint
			_, _ = crand(fp[:], rng)
			acct := accounts[rng.IntN(len(accounts))]
			if !clean && rng.IntN(10) == 0 {
				acct = payment.NewID() // unknown
			}
			cur := "USD"
			if rng.IntN(5) == 0 {
				cur = "EUR"
			}
			amount := 1 + int64(rng.IntN(200))
			if rng.IntN(12) == 0 {
				amount = refusedAmount
			}
			return chargedb.KeyedCharge{
				Request: idempotency.Request{MerchantID: merchant, Key: fmt.Sprintf("r%d-%s", round, uuid.NewString()), Fingerprint: fp},
				Charge:  payment.NewCharge{AccountID: acct, Amount: amount, Currency: cur},
				Render:  render,
			}
		}
		for batchNo := range 3 {
			n := 1 + rng.IntN(24)
			batch := make([]chargedb.KeyedCharge, n)
			for i := range batch {
				switch p := rng.IntN(10); {
				case clean:
					batch[i] = newRequest()
				case p == 0 && len(used) > 0: // a retry of an earlier request
					batch[i] = used[rng.IntN(len(used))]
				case p == 1 && len(used) > 0: // an earlier key, another request
					batch[i] = newRequest()
					batch[i].Request.Key = used[rng.IntN(len(used))].Request.Key
				default:
					batch[i] = newRequest()
				}
				used = append(used, batch[i])
			}
			where := fmt.Sprintf("round %d batch %d", round, batchNo)

			// What another transaction holds during the batch.
			holder, err := holderConn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var lockedAccount uuid.UUID
			if rng.IntN(3) == 0 {
				lockedAccount = accounts[rng.IntN(len(accounts))]
				if _, err := holder.Exec(ctx, `SELECT FROM accounts WHERE id = $1 FOR UPDATE`, lockedAccount); err != nil {
					t.Fatal(err)
				}
			}
			var heldKey string
			if rng.IntN(3) == 0 {
				heldKey = batch[rng.IntN(n)].Request.Key
				if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`, merchant, heldKey); err != nil {
					t.Fatal(err)
				}
			}
			began := time.Now()
			got, err := s.RunChargeBatch(ctx, batch)
			if took := time.Since(began); took > 2*time.Second {
				t.Errorf("%s took %v: it waited for what another transaction holds", where, took)
			}
			if rbErr := holder.Rollback(ctx); rbErr != nil {
				t.Fatal(rbErr)
			}
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}

			// The members that stayed, in order; then those that left, alone.
			var left []int
			leftKeys := map[string]bool{}
			for i, g := range got {
				r := batch[i]
				switch {
				case g.Busy && r.Charge.AccountID != lockedAccount:
					t.Fatalf("%s member %d left as busy, but its account is not the one held", where, i)
				case g.InFlight && r.Request.Key != heldKey && !leftKeys[r.Request.Key]:
					t.Fatalf("%s member %d left as in flight, but its key is not held", where, i)
				case g.Busy || g.InFlight:
					if g.Busy {
						busy++
					} else {
						inFlight++
					}
					left = append(left, i)
					leftKeys[r.Request.Key] = true
					continue
				}
				a, want := observed(g.Result, g.Err), m.charge(r)
				if a != want {
					t.Fatalf("%s member %d (%+v): got %+v, want %+v", where, i, r.Charge, a, want)
				}
				if errors.Is(a.err, errMemberFailed) {
					memberFailed++
				}
				if g.Result.Status == http.StatusCreated && !g.Result.Replayed {
					checkChargeBody(t, g.Result.Body, r.Charge.Amount)
				}
			}
			for _, i := range left {
				res, err := s.RunChargeAlone(ctx, batch[i])
				if a, want := observed(res, err), m.charge(batch[i]); a != want {
					t.Fatalf("%s member %d, alone after the batch (%+v): got %+v, want %+v", where, i, batch[i].Charge, a, want)
				}
			}
			for _, id := range accounts {
				var balance int64
				if err := s.Pool().QueryRow(ctx, `SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2`, merchant, id).Scan(&balance); err != nil {
					t.Fatal(err)
				}
				if balance != m.balances[id] {
					t.Fatalf("%s: account balance %d, want %d", where, balance, m.balances[id])
				}
			}
		}
		var succeeded, failed, events, keys int
		err := s.Pool().QueryRow(ctx, `
SELECT (SELECT count(*) FROM charges WHERE account_id = ANY($1) AND status = 'succeeded'),
       (SELECT count(*) FROM charges WHERE account_id = ANY($1) AND status = 'failed'),
       (SELECT count(*) FROM events e JOIN charges c ON c.merchant_id = e.merchant_id AND c.id = e.aggregate_id WHERE c.account_id = ANY($1)),
       (SELECT count(*) FROM idempotency_keys WHERE key LIKE $2)`, accounts, fmt.Sprintf("r%d-%%", round)).
			Scan(&succeeded, &failed, &events, &keys)
		if err != nil {
			t.Fatal(err)
		}
		if succeeded != m.charges[payment.ChargeSucceeded] || failed != m.charges[payment.ChargeFailed] ||
			events != succeeded+failed || keys != len(m.keys) {
			t.Fatalf("round %d: %d succeeded, %d failed, %d events, %d keys; want %d, %d, %d, %d", round,
				succeeded, failed, events, keys, m.charges[payment.ChargeSucceeded], m.charges[payment.ChargeFailed],
				m.charges[payment.ChargeSucceeded]+m.charges[payment.ChargeFailed], len(m.keys))
		}
	}
	ahead, refused := s.AheadStats()
	t.Logf("members that left their batch: %d for a busy account, %d for a key in flight; members whose own insert failed in the batch: %d; "+
		"batches decided ahead: %d committed, %d refused by the database", busy, inFlight, memberFailed, ahead, refused)
	if busy == 0 || inFlight == 0 || memberFailed == 0 || ahead == 0 || refused == 0 {
		t.Error("the rounds did not exercise every way a member can leave or fail, or a batch be decided ahead")
	}
}

// checkChargeBody checks that a fresh 201's body is a succeeded charge of
// amount.
func checkChargeBody(t *testing.T, body []byte, amount int64) {
	t.Helper()
	var c struct {
		Amount int64  `json:"amount"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(body, &c); err != nil || c.Amount != amount || c.Status != "succeeded" {
		t.Fatalf("a fresh 201's body: %s", body)
	}
}

func crand(b []byte, rng *rand.Rand) (int, error) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return len(b), nil
}
