package chaos_test

import (
	"net/http"
	"testing"
	"time"
)

// TestAuditFindsDamage checks the checker: a ledger damaged by hand, the way
// the faults must never damage it, fails every invariant the scenarios count
// on, so their zeros mean something.
func TestAuditFindsDamage(t *testing.T) {
	s := startScenario(t, 60*time.Second, testDatabase, "audit")
	ctx, bin, dbURL, m, db := s.ctx, s.bin, s.dbURL, s.merchants[0], s.db
	svc := newService(t, bin, serviceConfig{databaseURL: dbURL})
	c := newClient(t, m.APIKey, "audit-key-", func(int) string { return svc.url() })
	acct := c.mustAccount(t, ctx, usd)
	var ops []op
	for _, o := range []op{
		{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct, amount: 1000, body: []byte(`{"amount":1000}`)},
		{kind: "charge", path: "/v1/charges", account: acct, amount: 100, body: chargeBody(acct, 100)},
		{kind: "charge", path: "/v1/charges", account: acct, amount: 200, body: chargeBody(acct, 200)},
		{kind: "charge", path: "/v1/charges", account: acct, amount: 5000, body: chargeBody(acct, 5000)},
	} {
		ops = append(ops, drive(ctx, c, o))
	}
	if ops[3].answer.status != http.StatusPaymentRequired {
		t.Fatalf("the uncovered charge: %d %s", ops[3].answer.status, ops[3].answer.body)
	}
	if a := auditDatabase(t, ctx, db, m.ID); a.duplicateCharges+a.missingEvents+a.violations() != 0 || a.balanceGap != 0 {
		t.Fatalf("the undamaged ledger fails the audit: %s", a)
	}

	// A second charge under the first charge's key (a duplicate, debited), an
	// event lost, a key that lost its response, and a balance off by 7.
	for _, sql := range []string{
		`INSERT INTO charges (merchant_id, id, account_id, amount, currency, status, amount_captured)
		 SELECT merchant_id, gen_random_uuid(), account_id, amount, currency, status, amount_captured FROM charges WHERE amount = 100`,
		`UPDATE accounts SET balance = balance - 100`,
		`DELETE FROM events WHERE type = 'charge.failed'`,
		`UPDATE idempotency_keys SET status = NULL, body = NULL WHERE key = '` + ops[2].key + `'`,
		`UPDATE accounts SET balance = balance + 7`,
	} {
		_, err := db.Exec(ctx, sql)
		must(t, err, "damage: %s", sql)
	}
	a := auditDatabase(t, ctx, db, m.ID)
	if a.duplicateCharges != 2 || a.missingEvents != 2 || a.incompleteKeys != 1 || a.badBalances != 1 || a.balanceGap != 7 {
		// The 200 charge lost its key's response, so it counts as unkeyed
		// too; the duplicate has no event.
		t.Errorf("audit of the damaged ledger: %s", a)
	}
	// The client was told 1000 − 100 − 200 = 700; the table says 607.
	broken, gap, problems := clientView(t, ctx, db, m.ID, nil, ops)
	if broken != 1 || gap != 93 {
		t.Errorf("client view of the damaged ledger: %d broken answers, %d money gap; want 1 and 93: %q", broken, gap, problems)
	}
}

// TestAuditFindsSettlementDamage checks the audit's checks of authorizations:
// a hold the account no longer counts, a captured charge that also expired, a
// void without its event and a capture without its stored answer are each
// found.
func TestAuditFindsSettlementDamage(t *testing.T) {
	s := startScenario(t, 60*time.Second, testDatabase, "audit-holds")
	ctx, bin, dbURL, m, db := s.ctx, s.bin, s.dbURL, s.merchants[0], s.db
	svc := newService(t, bin, serviceConfig{databaseURL: dbURL})
	c := newClient(t, m.APIKey, "audit-key-", func(int) string { return svc.url() })
	acct := c.mustAccount(t, ctx, usd)
	drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", body: []byte(`{"amount":1000}`)})
	var auths []string
	for _, amount := range []int64{100, 200, 300} {
		o := drive(ctx, c, op{kind: "authorize", path: "/v1/charges", body: authorizeBody(acct, amount)})
		if o.answer.status != http.StatusCreated {
			t.Fatalf("authorize %d: %d %s", amount, o.answer.status, o.answer.body)
		}
		auths = append(auths, o.answer.field("id"))
	}
	capture := drive(ctx, c, captureOp(auths[0], acct, 60))
	void := drive(ctx, c, voidOp(auths[1], acct))
	if capture.answer.status != http.StatusOK || void.answer.status != http.StatusOK {
		t.Fatalf("capture %d %s, void %d %s", capture.answer.status, capture.answer.body, void.answer.status, void.answer.body)
	}
	if a := auditDatabase(t, ctx, db, m.ID); !a.clean() || a.authorizations != 3 || a.captured != 1 || a.voided != 1 {
		t.Fatalf("the undamaged ledger fails the audit: %s", a)
	}

	for _, sql := range []string{
		`UPDATE accounts SET held = held + 5`,
		`INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
		 SELECT merchant_id, gen_random_uuid(), 'charge', id, 'charge.expired', jsonb_build_object('amount', amount)
		 FROM charges WHERE status = 'succeeded'`,
		`DELETE FROM events WHERE type = 'charge.voided'`,
		`DELETE FROM idempotency_keys WHERE key = '` + capture.key + `'`,
	} {
		_, err := db.Exec(ctx, sql)
		must(t, err, "damage: %s", sql)
	}
	a := auditDatabase(t, ctx, db, m.ID)
	// The expired event on the captured charge is stray as well as a second
	// settlement.
	if a.badHolds != 1 || a.settledTwice != 1 || a.strayEvents != 1 || a.missingEvents != 1 || a.badSettleKeys != 1 ||
		a.settledBeforeAuth != 0 || a.duplicateCharges != 0 || a.balanceGap != 0 {
		t.Errorf("audit of the damaged ledger: %s", a)
	}
}
