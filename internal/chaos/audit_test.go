package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"

	"github.com/exactlyonce/payments/internal/payment"
)

// audit is what the database holds for one merchant, checked against the
// invariants. Every count but the first group must be zero.
type audit struct {
	accounts, deposits, charges, failed, refunds, keys, events int

	duplicateCharges  int   // charges no key, or more than one key, refers to
	unkeyedObjects    int   // accounts, deposits or refunds no key refers to
	keysWithoutObject int   // a stored 201 or 402 whose object does not exist
	incompleteKeys    int   // a key row without its stored response
	missingEvents     int   // objects without exactly one matching event
	strayEvents       int   // events describing no object
	badBalances       int   // accounts where balance ≠ deposits − captured amounts + refunds
	balanceGap        int64 // the sum of those differences, in minor units
	badRefundTotals   int   // charges whose amount_refunded ≠ the sum of their refunds
}

// violations sums the broken invariants other than duplicates and lost money.
func (a audit) violations() int {
	return a.unkeyedObjects + a.keysWithoutObject + a.incompleteKeys + a.strayEvents +
		a.badBalances + a.badRefundTotals
}

func (a audit) String() string {
	return fmt.Sprintf("%d accounts, %d deposits, %d charges (%d failed), %d refunds, %d keys, %d events; "+
		"duplicate charges %d, unkeyed objects %d, keys without object %d, keys without response %d, "+
		"objects without exactly one event %d, stray events %d, bad balances %d (gap %d), bad refund totals %d",
		a.accounts, a.deposits, a.charges, a.failed, a.refunds, a.keys, a.events,
		a.duplicateCharges, a.unkeyedObjects, a.keysWithoutObject, a.incompleteKeys,
		a.missingEvents, a.strayEvents, a.badBalances, a.balanceGap, a.badRefundTotals)
}

// report fails t for every broken invariant.
func (a audit) report(t *testing.T) {
	t.Helper()
	if a.duplicateCharges+a.missingEvents+a.violations() != 0 || a.balanceGap != 0 {
		t.Errorf("database audit: %s", a)
	} else {
		t.Logf("database audit: %s", a)
	}
}

// auditDatabase checks, in the tables, that every object a merchant has was
// created by exactly one idempotency key whose stored response names it, that
// every key's response names an object that exists, that every object has its
// one event, and that the money adds up.
func auditDatabase(t *testing.T, ctx context.Context, db *pgxpool.Pool, merchantID string) audit {
	t.Helper()
	mid, err := uuid.Parse(merchantID)
	must(t, err, "merchant id %q", merchantID)
	var a audit

	// Every object, by public id, with the event it must have.
	type object struct {
		kind      string // account, deposit, charge.succeeded, charge.failed, refund
		event     string // the type of its event
		amount    int64  // 0 for an account
		aggregate uuid.UUID
	}
	objects := map[string]object{}
	for _, q := range []struct{ sql, prefix string }{
		{`SELECT id, 'account', 0::bigint FROM accounts WHERE merchant_id = $1`, payment.PrefixAccount},
		{`SELECT id, 'deposit', amount FROM deposits WHERE merchant_id = $1`, payment.PrefixDeposit},
		{`SELECT id, 'charge.' || status, amount FROM charges WHERE merchant_id = $1`, payment.PrefixCharge},
		{`SELECT id, 'refund', amount FROM refunds WHERE merchant_id = $1`, payment.PrefixRefund},
	} {
		rows, err := db.Query(ctx, q.sql, mid)
		must(t, err, "select objects")
		for rows.Next() {
			var o object
			must(t, rows.Scan(&o.aggregate, &o.kind, &o.amount), "scan object")
			o.event = map[string]string{"account": "account.created", "deposit": "deposit.created", "refund": "refund.created"}[o.kind]
			switch o.kind {
			case "account":
				a.accounts++
			case "deposit":
				a.deposits++
			case "refund":
				a.refunds++
			case "charge.failed":
				a.failed++
				a.charges++
				o.event = o.kind
			default:
				a.charges++
				o.event = o.kind
			}
			objects[payment.FormatID(q.prefix, o.aggregate)] = o
		}
		must(t, rows.Err(), "select objects")
	}

	// Every key, and the object its stored response names.
	refs := map[string]int{}
	rows, err := db.Query(ctx, `SELECT key, status, body, `+bodyEncoding+` FROM idempotency_keys k WHERE merchant_id = $1`, mid)
	must(t, err, "select keys")
	for rows.Next() {
		k := scanKey(t, rows)
		status, body := k.status, k.body
		a.keys++
		if status == nil || body == nil {
			a.incompleteKeys++
			continue
		}
		id := objectOf(int(*status), body)
		if id == "" {
			continue // a stored refusal (404, 422, …) names no object
		}
		o, ok := objects[id]
		if !ok || (*status == http.StatusPaymentRequired) != (o.kind == "charge.failed") {
			a.keysWithoutObject++
			continue
		}
		refs[id]++
	}
	must(t, rows.Err(), "select keys")
	for id, o := range objects {
		switch n := refs[id]; {
		case strings.HasPrefix(o.kind, "charge.") && n != 1:
			a.duplicateCharges += max(1, n-1)
		case n != 1:
			a.unkeyedObjects++
		}
	}

	// One event per object, of the right type, describing it; no other events.
	byAggregate := map[uuid.UUID]object{}
	for _, o := range objects {
		byAggregate[o.aggregate] = o
	}
	described := map[uuid.UUID]int{}
	rows, err = db.Query(ctx, `SELECT aggregate_id, type, coalesce((payload->>'amount')::bigint, 0) FROM events WHERE merchant_id = $1`, mid)
	must(t, err, "select events")
	for rows.Next() {
		var (
			aggregate uuid.UUID
			typ       string
			amount    int64
		)
		must(t, rows.Scan(&aggregate, &typ, &amount), "scan event")
		a.events++
		o, ok := byAggregate[aggregate]
		if !ok || o.event != typ || o.amount != amount {
			a.strayEvents++
			continue
		}
		described[aggregate]++
	}
	must(t, rows.Err(), "select events")
	for _, o := range objects {
		if described[o.aggregate] != 1 {
			a.missingEvents++
		}
	}
	count := func(sql string) int {
		var n int
		must(t, db.QueryRow(ctx, sql, mid).Scan(&n), "count: %s", sql)
		return n
	}

	// The money: balance = deposits − captured amounts + refunds.
	must(t, db.QueryRow(ctx, `
SELECT count(*), coalesce(sum(abs(balance - (deposited - charged + refunded))), 0) FROM (
    SELECT a.balance,
           coalesce((SELECT sum(amount) FROM deposits d WHERE d.merchant_id = a.merchant_id AND d.account_id = a.id), 0) AS deposited,
           coalesce((SELECT sum(amount_captured) FROM charges c WHERE c.merchant_id = a.merchant_id AND c.account_id = a.id), 0) AS charged,
           coalesce((SELECT sum(amount) FROM refunds r WHERE r.merchant_id = a.merchant_id AND r.account_id = a.id), 0) AS refunded
    FROM accounts a WHERE a.merchant_id = $1) m
WHERE balance <> deposited - charged + refunded`, mid).Scan(&a.badBalances, &a.balanceGap), "check balances")
	a.badRefundTotals = count(`
SELECT count(*) FROM charges c WHERE merchant_id = $1 AND amount_refunded <>
    coalesce((SELECT sum(amount) FROM refunds r WHERE r.merchant_id = c.merchant_id AND r.charge_id = c.id), 0)`)
	return a
}

// objectOf returns the id of the object a stored response names: the created
// object of a 201, the failed charge of a 402, "" otherwise.
func objectOf(status int, body []byte) string {
	var v struct {
		ID       string `json:"id"`
		ChargeID string `json:"charge_id"`
	}
	_ = json.Unmarshal(body, &v)
	switch status {
	case http.StatusCreated:
		return v.ID
	case http.StatusPaymentRequired:
		return v.ChargeID
	}
	return ""
}

// op is one operation a client drove to a definite answer.
type op struct {
	kind     string // "charge", "refund", "deposit"
	key      string
	path     string
	body     []byte
	account  string
	amount   int64 // for a refund: what it asked for, or the charge's remainder
	answer   answer
	attempts int
}

// clientView compares what clients were told with the database: every
// definite answer is the one stored under its key, byte for byte; every
// object it names exists; and each account's balance is what the client's
// own ledger of answers says (opening balances plus 201 deposits, minus 201
// charges, plus 201 refunds). It returns the broken answers, the money the
// client's ledger and the database disagree on, and what is wrong.
func clientView(t *testing.T, ctx context.Context, db *pgxpool.Pool, merchantID string, opening map[string]int64, ops []op) (broken int, moneyGap int64, problems []string) {
	t.Helper()
	mid, err := uuid.Parse(merchantID)
	must(t, err, "merchant id")
	want := map[string]int64{}
	for acct, b := range opening {
		want[acct] = b
	}
	keys := map[string]storedKey{}
	rows, err := db.Query(ctx, `SELECT key, status, body, `+bodyEncoding+` FROM idempotency_keys k WHERE merchant_id = $1`, mid)
	must(t, err, "select keys")
	for rows.Next() {
		k := scanKey(t, rows)
		keys[k.key] = k
	}
	must(t, rows.Err(), "select keys")
	for _, o := range ops {
		if o.answer.status == http.StatusCreated {
			switch o.kind {
			case "charge":
				want[o.account] -= o.amount
			case "deposit":
				want[o.account] += o.amount
			case "refund":
				var v struct{ Amount int64 }
				_ = json.Unmarshal(o.answer.body, &v)
				want[o.account] += v.Amount
			}
		}
		switch s, ok := keys[o.key]; {
		case !ok:
			broken++
			problems = append(problems, fmt.Sprintf("%s with key %s was answered %d, but its key is not stored", o.kind, o.key, o.answer.status))
		case s.status == nil || int(*s.status) != o.answer.status || !bytes.Equal(s.body, o.answer.body):
			broken++
			problems = append(problems, fmt.Sprintf("%s with key %s: the client got %d %s, the key stores %v %s", o.kind, o.key, o.answer.status, o.answer.body, s.status, s.body))
		}
	}
	for acct, w := range want {
		id, ok := payment.ParseID(payment.PrefixAccount, acct)
		if !ok {
			t.Fatalf("bad account id %q", acct)
		}
		var got int64
		must(t, db.QueryRow(ctx, `SELECT balance FROM accounts WHERE merchant_id = $1 AND id = $2`, mid, id).Scan(&got), "balance")
		if got != w {
			problems = append(problems, fmt.Sprintf("account %s: balance %d in the database, %d by the client's answers", acct, got, w))
			moneyGap += abs(got - w)
		}
	}
	return broken, moneyGap, problems
}

// checkClientView runs clientView and fails t with its first problems.
func checkClientView(t *testing.T, ctx context.Context, db *pgxpool.Pool, merchantID string, ops []op) (broken int, moneyGap int64) {
	t.Helper()
	broken, moneyGap, problems := clientView(t, ctx, db, merchantID, nil, ops)
	for i, p := range problems {
		if i == 20 {
			t.Errorf("… and %d more", len(problems)-i)
			break
		}
		t.Error(p)
	}
	return broken, moneyGap
}

// verdict is what a scenario found once everything settled (judge).
type verdict struct {
	audit                   audit
	lostEvents, republished int   // events missing from the stream; events in it twice
	broken                  int   // answers the database contradicts, secrets in the logs
	moneyGap                int64 // money the clients' answers and the database disagree on
	badAnswers              int   // 500s, and 503/409 problems without their type or Retry-After
}

// lost is the money and the events the scenario lost.
func (s verdict) lost() int { return int(s.moneyGap) + s.lostEvents + s.audit.missingEvents }

// violations counts every other broken invariant judge found.
func (s verdict) violations() int { return s.audit.violations() + s.broken + s.badAnswers }

// judge ends a scenario with a relay inside svc: it waits until every event
// is published, stops svc, and holds the stream, the database, the clients'
// answers (ops) and the service's logs against each other, failing t for
// every problem.
func judge(t *testing.T, ctx context.Context, db *pgxpool.Pool, svc *service, natsURL string, m merchant, c *client, ops []op) verdict {
	t.Helper()
	waitDrained(t, ctx, db)
	svc.stop()
	var s verdict
	s.lostEvents, s.republished = compareStream(t, ctx, db, natsURL)
	s.audit = auditDatabase(t, ctx, db, m.ID)
	s.audit.report(t)
	s.broken, s.moneyGap = checkClientView(t, ctx, db, m.ID, ops)
	if leaked := logsMention(svc.logs.String(), c.keyPrefix, m.APIKey); len(leaked) > 0 {
		t.Errorf("the service logged %q", leaked)
		s.broken++
	}
	st := c.stats
	if s.badAnswers = int(st.internal.Load() + st.badProblems.Load()); s.badAnswers > 0 {
		t.Errorf("%d answers were 500, %d 503/409 problems lacked their type or Retry-After", st.internal.Load(), st.badProblems.Load())
	}
	return s
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// bodyEncoding selects a key row's body_encoding, or NULL on a schema that
// stores every body as it is.
const bodyEncoding = `to_jsonb(k) ->> 'body_encoding'`

// storedKey is an idempotency key row with its response body decoded.
type storedKey struct {
	key    string
	status *int32
	body   []byte
}

// scanKey reads a row of key, status, body and its encoding.
func scanKey(t *testing.T, rows pgx.Rows) storedKey {
	t.Helper()
	var (
		k        storedKey
		encoding *string
	)
	must(t, rows.Scan(&k.key, &k.status, &k.body, &encoding), "scan key")
	switch {
	case encoding == nil || k.body == nil:
	case *encoding == "zstd":
		body, err := zstdDecoder.DecodeAll(k.body, nil)
		must(t, err, "decompress the body of key %q", k.key)
		k.body = body
	default:
		t.Fatalf("key %q: unknown body encoding %q", k.key, *encoding)
	}
	return k
}

var zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
