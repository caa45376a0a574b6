package charging

import (
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// decideBatch answers a batch's members in order from what the first round
// trip found (chargedb.Store.Lock),
// and gathers what the batch writes. decided[i] tells a member answered by
// this batch's execution from one answered by a stored row or that left.
func decideBatch(reqs []chargedb.KeyedCharge, locks *chargedb.Locks, holdFor time.Duration) (answers []chargeAnswer, decided []bool, w *writes) {
	n := len(reqs)
	answers, decided, w = make([]chargeAnswer, n), make([]bool, n), &writes{}
	first := make(map[idempotency.Request]int, n) // by (merchant, key): the member that executed it
	for i, r := range reqs {
		id := idempotency.Request{MerchantID: r.Request.MerchantID, Key: r.Request.Key}
		j, seen := first[id]
		switch {
		case !locks.KeyHeld[i]:
			answers[i].inFlight = true
		case locks.Stored[i].Found && !locks.Stored[i].Expired:
			// An answer from a stored row: confirm it
			// (internal/postgres/durable.go).
			w.ConfirmReplays = true
			answers[i].res, answers[i].err = replayStored(r.Request, locks.Stored[i])
		case seen && answers[j].left():
			// Its key's first member left the batch: it waits for that
			// one's outcome, as it would have alone.
			answers[i].inFlight = true
		case seen: // j's answer is final: it was decided above
			answers[i] = sameKey(r.Request, reqs[j].Request, answers[j])
			decided[i] = true
		case locks.Busy[r.Account()]:
			first[id] = i
			answers[i].busy = true
		default:
			first[id] = i
			decided[i] = true
			if locks.Stored[i].Found {
				w.Expired = append(w.Expired, r.Request)
			}
			answers[i].res, answers[i].err = w.decide(r, locks.Accounts, locks.Now, holdFor)
		}
	}
	return answers, decided, w
}

// replayStored answers req from the response stored under its key.
func replayStored(req idempotency.Request, k chargedb.StoredKey) (idempotency.Result, error) {
	if len(k.Fingerprint) != len(req.Fingerprint) {
		return idempotency.Result{}, errors.New("stored idempotency key has a malformed fingerprint")
	}
	if idempotency.Fingerprint(k.Fingerprint) != req.Fingerprint {
		return idempotency.Result{}, idempotency.ErrKeyReused
	}
	if k.Resp.Status == 0 {
		// Cannot happen: a key without a response is bound to an operation
		// at a processor, whose request is not an account's charge, so its
		// fingerprint differs.
		return idempotency.Result{}, errors.New("stored idempotency key has no response")
	}
	if k.DecodeErr != nil {
		return idempotency.Result{}, k.DecodeErr
	}
	res, err := idempotency.Replay(req, idempotency.Fingerprint(k.Fingerprint), k.Resp)
	res.StoredAt = k.StoredAt
	return res, err
}

// sameKey answers a member whose key an earlier member of the batch executed,
// as if it had arrived just after that member committed.
func sameKey(req, firstReq idempotency.Request, first chargeAnswer) chargeAnswer {
	switch {
	case first.err != nil:
		return chargeAnswer{err: first.err}
	}
	res, err := idempotency.Replay(req, firstReq.Fingerprint, first.res.Response)
	res.StoredAt = first.res.StoredAt
	return chargeAnswer{res: res, err: err}
}

// writes is what a batch writes (chargedb.Writes), with the place of each
// account's debit.
type writes struct {
	chargedb.Writes
	debitIndex map[chargedb.AccountKey]int // by account: its place in Debits
}

// decide decides one member's charge against the accounts as the members
// before it left them, renders its answer, and adds what it writes. The
// account is changed only once the member's answer is rendered: one that
// fails writes nothing, so it takes nothing from what the members after it
// see.
func (w *writes) decide(r chargedb.KeyedCharge, accounts map[chargedb.AccountKey]*payment.Account, now time.Time, holdFor time.Duration) (idempotency.Result, error) {
	ak := r.Account()
	var after *payment.Account // the account as this member would leave it
	if a := accounts[ak]; a != nil {
		copied := *a
		after = &copied
	}
	c, refused := payment.ChargeAccount(after, payment.NewID(), r.Charge, now, holdFor)
	var payload []byte
	if refused == nil {
		var err error
		if payload, err = c.MarshalJSON(); err != nil {
			return idempotency.Result{}, err
		}
	}
	resp, err := r.Render(c, payload, refused)
	if err != nil {
		return idempotency.Result{}, err
	}
	if refused == nil {
		*accounts[ak] = *after
		w.addCharge(r.Request.MerchantID, c, payload)
		switch c.Status {
		case payment.ChargeSucceeded:
			w.debit(ak, c.Amount, 0)
		case payment.ChargeAuthorized:
			w.debit(ak, 0, c.Amount)
		}
	}
	w.Keys = append(w.Keys, chargedb.KeyRow{Req: r.Request, Resp: resp})
	return idempotency.Result{Response: resp}, nil
}

// debit adds what a member takes from its account's balance (amount) and
// holds on it (hold) to the account's one debit.
func (w *writes) debit(ak chargedb.AccountKey, amount, hold int64) {
	if w.debitIndex == nil {
		w.debitIndex = make(map[chargedb.AccountKey]int)
	}
	if i, ok := w.debitIndex[ak]; ok {
		w.Debits[i].Amount += amount
		w.Debits[i].Hold += hold
		return
	}
	w.debitIndex[ak] = len(w.Debits)
	w.Debits = append(w.Debits, chargedb.Debit{Account: ak, Amount: amount, Hold: hold})
}

func (w *writes) addCharge(merchant uuid.UUID, c payment.Charge, payload []byte) {
	eventType := payment.EventChargeSucceeded
	switch c.Status {
	case payment.ChargeFailed:
		eventType = payment.EventChargeFailed
	case payment.ChargeAuthorized:
		eventType = payment.EventChargeAuthorized
	}
	w.Charges = append(w.Charges, chargedb.ChargeRow{Merchant: merchant, Charge: c, EventID: payment.NewID(), EventType: eventType, Payload: payload})
}
