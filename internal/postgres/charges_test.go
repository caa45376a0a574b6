package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"payments/internal/idempotency"
	"payments/internal/payment"
	"payments/internal/pgtest"
)

// render is a idempotency.ChargeRenderer as simple as the API's: 201 with the charge, 402
// for a failed one, 404 and 422 for a refusal.
func render(c payment.Charge, body []byte, err error) (idempotency.Response, error) {
	switch {
	case errors.Is(err, payment.ErrAccountNotFound):
		return idempotency.Response{Status: http.StatusNotFound, Body: []byte(`"no account"`)}, nil
	case errors.Is(err, payment.ErrCurrencyMismatch):
		return idempotency.Response{Status: http.StatusUnprocessableEntity, Body: []byte(`"currency"`)}, nil
	case err != nil:
		return idempotency.Response{}, err
	case c.Status == payment.ChargeFailed:
		return idempotency.Response{Status: http.StatusPaymentRequired, Body: []byte(`"` + c.ID.String() + `"`)}, nil
	}
	return idempotency.Response{Status: http.StatusCreated, Body: body}, nil
}

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

func (m *model) charge(r idempotency.ChargeRequest) answer {
	if k, ok := m.keys[r.Key.Key]; ok {
		if k.fp != r.Key.Fingerprint {
			return answer{err: idempotency.ErrKeyReused}
		}
		return answer{status: k.status, replayed: true}
	}
	var a *payment.Account
	if cur, ok := m.currency[r.Charge.AccountID]; ok {
		a = &payment.Account{ID: r.Charge.AccountID, Currency: cur, Balance: m.balances[r.Charge.AccountID]}
	}
	c, err := payment.ChargeAccount(a, payment.NewID(), r.Charge, time.Time{})
	resp, _ := render(c, nil, err)
	if err == nil {
		m.charges[c.Status]++
		m.balances[a.ID] = a.Balance
	}
	m.keys[r.Key.Key] = modelKey{fp: r.Key.Fingerprint, status: resp.Status}
	return answer{status: resp.Status}
}

// TestBatchEqualsOneAtATime: random batches mixing every outcome (covered,
// not covered, unknown account, wrong currency, replay, reused key, the same
// key twice in the batch, many charges on one account) give each member
// exactly the answer, and leave exactly the balances, that executing them one
// at a time in the batch's order gives.
func TestBatchEqualsOneAtATime(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.NewDatabase(t))
	merchant, _, err := s.CreateMerchant(ctx, "batch")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 40 {
		// Four accounts: three in USD, one in EUR, with small balances so
		// that charges run out of money part way through a batch.
		m := &model{balances: map[uuid.UUID]int64{}, currency: map[uuid.UUID]string{}, keys: map[string]modelKey{},
			charges: map[payment.ChargeStatus]int{}}
		var accounts []uuid.UUID
		for i, cur := range []string{"USD", "USD", "USD", "EUR"} {
			id := payment.NewID()
			balance := int64(rng.IntN(500))
			if _, err := s.Pool().Exec(ctx, `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, $3, $4)`,
				merchant, id, cur, balance); err != nil {
				t.Fatal(err)
			}
			m.balances[id], m.currency[id] = balance, cur
			accounts = append(accounts, id)
			_ = i
		}
		var used []idempotency.ChargeRequest
		newRequest := func() idempotency.ChargeRequest {
			var fp idempotency.Fingerprint
			_, _ = crand(fp[:], rng)
			acct := accounts[rng.IntN(len(accounts))]
			if rng.IntN(10) == 0 {
				acct = payment.NewID() // unknown
			}
			cur := "USD"
			if rng.IntN(5) == 0 {
				cur = "EUR"
			}
			return idempotency.ChargeRequest{
				Key:    idempotency.Request{MerchantID: merchant, Key: fmt.Sprintf("r%d-%s", round, uuid.NewString()), Fingerprint: fp},
				Charge: payment.NewCharge{AccountID: acct, Amount: 1 + int64(rng.IntN(200)), Currency: cur},
				Render: render,
			}
		}
		for batchNo := range 2 {
			n := 1 + rng.IntN(24)
			batch := make([]idempotency.ChargeRequest, n)
			for i := range batch {
				switch p := rng.IntN(10); {
				case p == 0 && len(used) > 0: // a retry of an earlier request
					batch[i] = used[rng.IntN(len(used))]
				case p == 1 && len(used) > 0: // an earlier key, another request
					batch[i] = newRequest()
					batch[i].Key.Key = used[rng.IntN(len(used))].Key.Key
				default:
					batch[i] = newRequest()
				}
				used = append(used, batch[i])
			}
			want := make([]answer, n)
			for i, r := range batch {
				want[i] = m.charge(r)
			}
			got, err := s.RunChargeBatch(ctx, batch)
			if err != nil {
				t.Fatalf("round %d batch %d: %v", round, batchNo, err)
			}
			for i, g := range got {
				a := answer{status: g.Result.Status, replayed: g.Result.Replayed, err: g.Err}
				if g.InFlight || a != want[i] {
					t.Fatalf("round %d batch %d member %d (%+v): got %+v (in flight %v), want %+v",
						round, batchNo, i, batch[i].Charge, a, g.InFlight, want[i])
				}
				if a.status == http.StatusCreated && !a.replayed {
					var c struct {
						Amount int64  `json:"amount"`
						Status string `json:"status"`
					}
					if err := json.Unmarshal(g.Result.Body, &c); err != nil || c.Amount != batch[i].Charge.Amount || c.Status != "succeeded" {
						t.Fatalf("member %d: body %s", i, g.Result.Body)
					}
				}
			}
			for _, id := range accounts {
				var balance int64
				if err := s.Pool().QueryRow(ctx, `SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2`, merchant, id).Scan(&balance); err != nil {
					t.Fatal(err)
				}
				if balance != m.balances[id] {
					t.Fatalf("round %d batch %d: account balance %d, want %d", round, batchNo, balance, m.balances[id])
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
}

func crand(b []byte, rng *rand.Rand) (int, error) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return len(b), nil
}
