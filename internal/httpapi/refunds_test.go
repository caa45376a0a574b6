package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// charge makes a succeeded charge and returns its id.
func (f *fixture) charge(acct string, amount int64) string {
	f.t.Helper()
	r := f.post("/v1/charges", uuid.NewString(), chargeBody(acct, amount))
	if r.status != http.StatusCreated {
		f.t.Fatalf("charge: %d %s", r.status, r.body)
	}
	return r.json(f.t)["id"].(string)
}

func (f *fixture) amountRefunded(chargeID string) float64 {
	f.t.Helper()
	r := f.get("/v1/charges/" + chargeID)
	if r.status != http.StatusOK {
		f.t.Fatalf("GET charge: %d %s", r.status, r.body)
	}
	return r.json(f.t)["amount_refunded"].(float64)
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	ch := f.charge(acct, 600) // balance 400

	key := uuid.NewString()
	partial := f.post("/v1/charges/"+ch+"/refunds", key, `{"amount":150}`)
	if partial.status != http.StatusCreated {
		t.Fatalf("partial refund: %d %s", partial.status, partial.body)
	}
	re := partial.json(t)
	if re["object"] != "refund" || re["amount"] != float64(150) || re["charge_id"] != ch || re["account_id"] != acct {
		t.Errorf("refund = %s", partial.body)
	}
	if got := f.get(partial.header.Get("Location")); got.status != http.StatusOK || !bytes.Equal(got.body, partial.body) {
		t.Errorf("GET %s = %d %s", partial.header.Get("Location"), got.status, got.body)
	}
	if again := f.post("/v1/charges/"+ch+"/refunds", key, `{"amount":150}`); !bytes.Equal(again.body, partial.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("refund replay = %d %s", again.status, again.body)
	}
	if f.balance(acct) != 550 || f.amountRefunded(ch) != 150 {
		t.Fatalf("after 150 refunded: balance %d (want 550), amount_refunded %v (want 150)", f.balance(acct), f.amountRefunded(ch))
	}

	over := f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), `{"amount":451}`)
	if over.status != http.StatusUnprocessableEntity || over.code(t) != "refund-exceeds-charge" {
		t.Errorf("over-refund = %d %s, want 422 refund-exceeds-charge", over.status, over.body)
	}

	// No amount: what is left.
	rest := f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), `{}`)
	if rest.status != http.StatusCreated || rest.json(t)["amount"] != float64(450) {
		t.Fatalf("refund of the rest = %d %s", rest.status, rest.body)
	}
	if empty := f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), `{}`); empty.status != http.StatusUnprocessableEntity || empty.code(t) != "refund-exceeds-charge" {
		t.Errorf("refund of a fully refunded charge = %d %s", empty.status, empty.body)
	}
	if f.balance(acct) != 1000 || f.amountRefunded(ch) != 600 {
		t.Errorf("fully refunded: balance %d (want 1000), amount_refunded %v (want 600)", f.balance(acct), f.amountRefunded(ch))
	}

	failed := f.post("/v1/charges", uuid.NewString(), chargeBody(acct, 5000))
	failedID, _ := failed.json(t)["charge_id"].(string)
	if r := f.post("/v1/charges/"+failedID+"/refunds", uuid.NewString(), `{}`); r.status != http.StatusConflict || r.code(t) != "charge-not-refundable" {
		t.Errorf("refund of a failed charge = %d %s, want 409 charge-not-refundable", r.status, r.body)
	}
	if r := f.post("/v1/charges/ch_"+strings.Repeat("a", 32)+"/refunds", uuid.NewString(), `{}`); r.status != http.StatusNotFound {
		t.Errorf("refund of an unknown charge = %d %s", r.status, r.body)
	}
	for _, body := range []string{`{"amount":0}`, `{"amount":-1}`, `{"amount":"5"}`, `{"reason":"x"}`} {
		if r := f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), body); r.status != http.StatusBadRequest {
			t.Errorf("refund %s = %d %s, want 400", body, r.status, r.body)
		}
	}
	if n := f.count(`SELECT count(*) FROM refunds WHERE merchant_id = $1`); n != 2 {
		t.Errorf("%d refund rows, want 2", n)
	}
	f.checkLedger(acct)
}

// TestConcurrentRefundsNeverExceedTheCharge: 20 refunds of 400 race for a
// charge of 600; exactly one fits.
func TestConcurrentRefundsNeverExceedTheCharge(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 600)
	ch := f.charge(acct, 600) // balance 0

	const n = 20
	statuses := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req := f.request(http.MethodPost, "/v1/charges/"+ch+"/refunds", uuid.NewString(), `{"amount":400}`)
			<-start
			statuses[i] = f.do(req).status
		})
	}
	close(start)
	wg.Wait()

	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[http.StatusCreated] != 1 || count[http.StatusUnprocessableEntity] != n-1 {
		t.Errorf("statuses = %v, want one 201 and %d × 422", count, n-1)
	}
	if f.balance(acct) != 400 || f.amountRefunded(ch) != 400 {
		t.Errorf("balance %d (want 400), amount_refunded %v (want 400)", f.balance(acct), f.amountRefunded(ch))
	}
	if n := f.count(`SELECT count(*) FROM refunds WHERE merchant_id = $1`); n != 1 {
		t.Errorf("%d refund rows, want 1", n)
	}
	f.checkLedger(acct)
}

// TestRolledBackTransactionLeavesNoEvent fails a charge's transaction right
// after its event is written: neither the event nor the charge may survive.
func TestRolledBackTransactionLeavesNoEvent(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) })
	acct := f.account("USD", 1000)
	eventsBefore := f.count(`SELECT count(*) FROM events WHERE merchant_id = $1`)
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `
CREATE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected fault'; END $$;
CREATE TRIGGER inject_fault AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION inject_fault();`); err != nil {
		t.Fatal(err)
	}
	key := uuid.NewString()
	if r := f.post("/v1/charges", key, chargeBody(acct, 300)); r.status != http.StatusInternalServerError {
		t.Fatalf("got %d %s, want 500", r.status, r.body)
	}
	if n := f.count(`SELECT count(*) FROM events WHERE merchant_id = $1`); n != eventsBefore {
		t.Errorf("%d events after the rollback, want %d", n, eventsBefore)
	}
	if f.charges() != 0 || f.balance(acct) != 1000 {
		t.Errorf("%d charges, balance %d after the rollback", f.charges(), f.balance(acct))
	}
	if f.keys() != 2 {
		t.Errorf("%d keys after the rollback, want 2 (the account's and the deposit's)", f.keys())
	}
	if _, err := f.db.Exec(ctx, `DROP TRIGGER inject_fault ON events`); err != nil {
		t.Fatal(err)
	}
	if r := f.post("/v1/charges", key, chargeBody(acct, 300)); r.status != http.StatusCreated {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	if n := f.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = 'charge.succeeded'`); n != 1 {
		t.Errorf("%d charge.succeeded events after the retry, want 1", n)
	}
}

// TestRefundWaitsForTheChargeLock: while another transaction refunds the whole
// charge, a concurrent refund waits for the charge's row and is then decided
// from what that transaction left: 422 refund-exceeds-charge, never a second
// refund and never a 500. It does not depend on scheduling: the first
// transaction is held open until the refund is seen waiting on it.
func TestRefundWaitsForTheChargeLock(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 600)
	ch := f.charge(acct, 600) // balance 0
	chargeID, _ := payment.ParseID(payment.PrefixCharge, ch)
	accountID, _ := payment.ParseID(payment.PrefixAccount, acct)

	// A full refund in flight in another transaction: the charge row is
	// locked by its UPDATE until it commits.
	ctx := context.Background()
	holder, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) // a no-op once committed
	var holderPID int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `
WITH c AS (
    UPDATE charges SET amount_refunded = amount WHERE merchant_id = $1 AND id = $2
), a AS (
    UPDATE accounts SET balance = balance + 600 WHERE merchant_id = $1 AND id = $3
)
INSERT INTO refunds (merchant_id, id, charge_id, account_id, amount, currency)
VALUES ($1, gen_random_uuid(), $2, $3, 600, 'USD')`, f.merchantID, chargeID, accountID); err != nil {
		t.Fatal(err)
	}

	answer := make(chan reply, 1)
	req := f.request(http.MethodPost, "/v1/charges/"+ch+"/refunds", uuid.NewString(), `{"amount":400}`)
	go func() { answer <- f.do(req) }()
	f.awaitBlockedBy(t, holderPID)
	select {
	case r := <-answer:
		t.Fatalf("the refund answered %d %s while the charge was locked", r.status, r.body)
	default:
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	r := <-answer
	if r.status != http.StatusUnprocessableEntity || r.code(t) != "refund-exceeds-charge" {
		t.Errorf("the waiting refund got %d %s, want 422 refund-exceeds-charge", r.status, r.body)
	}
	if n := f.count(`SELECT count(*) FROM refunds WHERE merchant_id = $1`); n != 1 || f.balance(acct) != 600 || f.amountRefunded(ch) != 600 {
		t.Errorf("%d refunds (want 1), balance %d (want 600), amount_refunded %v (want 600)", n, f.balance(acct), f.amountRefunded(ch))
	}
	f.checkLedger(acct)
}

// awaitBlockedBy waits until some backend is waiting for a lock that the
// backend pid holds, for up to 10 s.
func (f *fixture) awaitBlockedBy(t *testing.T, pid int) {
	t.Helper()
	const bound = 10 * time.Second
	for deadline := time.Now().Add(bound); ; time.Sleep(10 * time.Millisecond) {
		var waiting bool
		if err := f.db.QueryRow(context.Background(),
			`SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request waited for the lock held by backend %d within %v", pid, bound)
		}
	}
}
