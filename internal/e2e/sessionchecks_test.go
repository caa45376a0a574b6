package e2e_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sessionCheck asserts what a document's session left behind: the money of
// the merchant it ran as (merchantID), and what it printed (output).
type sessionCheck func(t *testing.T, db *pgxpool.Pool, merchantID, output string)

// sessionChecks holds a check for every document with blocks that run: the
// balances, rows and answers its text promises the reader.
var sessionChecks = map[string]sessionCheck{
	"README.md": func(t *testing.T, db *pgxpool.Pool, merchant, output string) {
		// One account funded with 10000, one charge of 2500 sent twice; a
		// test card charged once though sent twice, and one answered late.
		want(t, db, "accounts", 1, `SELECT count(*) FROM accounts WHERE merchant_id = $1`, merchant)
		want(t, db, "balance", 7500, `SELECT sum(balance) FROM accounts WHERE merchant_id = $1`, merchant)
		want(t, db, "account charges", 1, `SELECT count(*) FROM charges WHERE merchant_id = $1 AND account_id IS NOT NULL`, merchant)
		want(t, db, "card charges", 2, `SELECT count(*) FROM charges WHERE merchant_id = $1 AND payment_method IS NOT NULL`, merchant)
		want(t, db, "card charges succeeded", 1,
			`SELECT count(*) FROM charges WHERE merchant_id = $1 AND payment_method = 'pm_card_approve' AND status = 'succeeded'`, merchant)
		printed(t, output, "Idempotent-Replayed: true", `"code":"idempotency-key-reused"`, "HTTP/1.1 202 Accepted", `"status":"processing"`)
	},
	"docs/api.md": func(t *testing.T, db *pgxpool.Pool, merchant, output string) {
		// 10000 deposited; 2500 and 1000 charged, 999999 refused, 2500
		// refunded, 3000 authorized of which 2000 captured.
		want(t, db, "balance", 7000, `SELECT sum(balance) FROM accounts WHERE merchant_id = $1`, merchant)
		want(t, db, "succeeded charges", 3, `SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'succeeded'`, merchant)
		want(t, db, "failed charges", 1, `SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'failed'`, merchant)
		want(t, db, "refunded", 2500, `SELECT sum(amount) FROM refunds WHERE merchant_id = $1`, merchant)
		printed(t, output, `"code":"insufficient-funds"`, `"code":"refund-exceeds-charge"`, `"available":6000`, `"code":"charge-not-voidable"`)
	},
	"docs/webhooks.md": func(t *testing.T, db *pgxpool.Pool, merchant, output string) {
		want(t, db, "balance", 3800, `SELECT sum(balance) FROM accounts WHERE merchant_id = $1`, merchant)
		want(t, db, "deleted endpoints", 1, `SELECT count(*) FROM webhook_endpoints WHERE merchant_id = $1 AND deleted_at IS NOT NULL`, merchant)
		want(t, db, "deliveries the receiver took (204)", 1,
			`SELECT count(DISTINCT event_id) FROM webhook_attempts WHERE merchant_id = $1 AND status = 204`, merchant)
		printed(t, output, "verified charge.succeeded evt_", `"status":"disabled"`, `"resumes_after":"evt_`, `"state":"pending"`,
			"duplicate charge.succeeded evt_", `"deleted":true`)
	},
	"docs/events.md": func(t *testing.T, db *pgxpool.Pool, _, output string) {
		// The consumer ran beside serve until the session killed it (kill
		// fails the session when it has exited) and projected the balances
		// of the sessions before it; psql answered twice.
		var projected int64
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM account_balances p
			JOIN accounts a ON (a.merchant_id, a.id) = (p.merchant_id, p.account_id) WHERE p.balance = a.balance`).Scan(&projected); err != nil {
			t.Fatal(err)
		}
		if projected == 0 {
			t.Errorf("the consumer projected no account's balance; the session printed:\n%s", output)
		}
		printed(t, output, "account_id", "balance", "unpublished")
	},
	"docs/operations.md": func(t *testing.T, db *pgxpool.Pool, _, output string) {
		// The rotation, on a merchant of its own: two keys, the first revoked.
		want(t, db, "keys of rotation-demo", 2,
			`SELECT count(*) FROM api_keys k JOIN merchants m ON m.id = k.merchant_id WHERE m.name = $1`, "rotation-demo")
		want(t, db, "revoked keys of rotation-demo", 1,
			`SELECT count(k.revoked_at) FROM api_keys k JOIN merchants m ON m.id = k.merchant_id WHERE m.name = $1`, "rotation-demo")
		printed(t, output, `"revoked_at":"20`, `"merchants":[`)
	},
}

// want fails the test unless query (one bigint, NULL read as 0) gives n.
func want(t *testing.T, db *pgxpool.Pool, what string, n int64, query string, args ...any) {
	t.Helper()
	var got int64
	if err := db.QueryRow(context.Background(), "SELECT coalesce(("+query+"), 0)::bigint", args...).Scan(&got); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got != n {
		t.Errorf("%s: %d, want %d", what, got, n)
	}
}

// printed fails the test unless the session's output holds each of texts.
func printed(t *testing.T, output string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		if !strings.Contains(output, s) {
			t.Errorf("the session did not print %q; it printed:\n%s", s, output)
		}
	}
}
