package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
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
	authorizations, captured, voided, expired                  int // charges created with capture false, by what became of them

	duplicateCharges  int   // charges no key, or more than one key, refers to
	unkeyedObjects    int   // accounts, deposits or refunds no key refers to
	keysWithoutObject int   // a stored 201 or 402 whose object does not exist
	incompleteKeys    int   // a key row without its stored response
	missingEvents     int   // objects (and each step of an authorization) without exactly one matching event
	strayEvents       int   // events describing no object, or a step it did not take
	badBalances       int   // accounts where balance ≠ deposits − captured amounts + refunds
	balanceGap        int64 // the sum of those differences, in minor units
	badRefundTotals   int   // charges whose amount_refunded ≠ the sum of their refunds
	badHolds          int   // accounts whose held ≠ the sum of their charges in status authorized
	settledTwice      int   // authorizations with more than one of captured, voided, expired among their events
	settledBeforeAuth int   // a capture, void or expiry event before the charge's authorization event
	badSettleKeys     int   // captured or voided authorizations without exactly one stored 200 saying so
}

// violations sums the broken invariants other than duplicates and lost money.
func (a audit) violations() int {
	return a.unkeyedObjects + a.keysWithoutObject + a.incompleteKeys + a.strayEvents +
		a.badBalances + a.badRefundTotals + a.badHolds + a.settledTwice + a.settledBeforeAuth + a.badSettleKeys
}

func (a audit) String() string {
	return fmt.Sprintf("%d accounts, %d deposits, %d charges (%d failed; %d authorizations: %d captured, %d voided, %d expired), "+
		"%d refunds, %d keys, %d events; "+
		"duplicate charges %d, unkeyed objects %d, keys without object %d, keys without response %d, "+
		"objects without exactly one event %d, stray events %d, bad balances %d (gap %d), bad refund totals %d, "+
		"bad holds %d, settled twice %d, settled before authorized %d, settlements without one stored 200 %d",
		a.accounts, a.deposits, a.charges, a.failed, a.authorizations, a.captured, a.voided, a.expired,
		a.refunds, a.keys, a.events,
		a.duplicateCharges, a.unkeyedObjects, a.keysWithoutObject, a.incompleteKeys,
		a.missingEvents, a.strayEvents, a.badBalances, a.balanceGap, a.badRefundTotals,
		a.badHolds, a.settledTwice, a.settledBeforeAuth, a.badSettleKeys)
}

// clean reports whether every invariant holds.
func (a audit) clean() bool {
	return a.duplicateCharges+a.missingEvents+a.violations() == 0 && a.balanceGap == 0
}

// report fails t for every broken invariant.
func (a audit) report(t *testing.T) {
	t.Helper()
	if !a.clean() {
		t.Errorf("database audit: %s", a)
	} else {
		t.Logf("database audit: %s", a)
	}
}

// auditDatabase checks, in the tables, that every object a merchant has was
// created by exactly one idempotency key whose stored response names it, that
// every key's response names an object that exists, that every object has its
// one event (an authorization one for each step it took), that every capture
// or void was stored once under its key, and that the money and the holds add
// up.
func auditDatabase(t *testing.T, ctx context.Context, db *pgxpool.Pool, merchantID string) audit {
	t.Helper()
	mid, err := uuid.Parse(merchantID)
	must(t, err, "merchant id %q", merchantID)
	var a audit
	objects := a.objects(t, ctx, db, mid)
	a.checkKeys(t, ctx, db, mid, objects)
	a.checkEvents(t, ctx, db, mid, objects)
	a.checkMoney(t, ctx, db, mid)
	return a
}

// object is a row of the merchant's, by public id, with the events it must
// have, each exactly once.
type object struct {
	kind      string   // account, deposit, charge.<status>, refund
	events    []string // the types of its events
	amount    int64    // 0 for an account
	captured  int64    // a charge's amount_captured
	aggregate uuid.UUID
}

// authorization reports whether the object is a charge created with capture
// false: its first event is charge.authorized.
func (o object) authorization() bool {
	return len(o.events) > 0 && o.events[0] == payment.EventChargeAuthorized
}

// objects reads every object of the merchant, counting them.
func (a *audit) objects(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID) map[string]object {
	t.Helper()
	objects := map[string]object{}
	for _, q := range []struct{ sql, prefix string }{
		{`SELECT id, 'account', 0::bigint, 0::bigint, false FROM accounts WHERE merchant_id = $1`, payment.PrefixAccount},
		{`SELECT id, 'deposit', amount, 0::bigint, false FROM deposits WHERE merchant_id = $1`, payment.PrefixDeposit},
		// Every authorization, and only they, have an expires_at; a failed
		// one is recorded as a failed charge.
		{`SELECT id, 'charge.' || status, amount, amount_captured, expires_at IS NOT NULL AND status <> 'failed'
		  FROM charges WHERE merchant_id = $1`, payment.PrefixCharge},
		{`SELECT id, 'refund', amount, 0::bigint, false FROM refunds WHERE merchant_id = $1`, payment.PrefixRefund},
	} {
		rows, err := db.Query(ctx, q.sql, mid)
		must(t, err, "select objects")
		for rows.Next() {
			var (
				o          object
				authorized bool
			)
			must(t, rows.Scan(&o.aggregate, &o.kind, &o.amount, &o.captured, &authorized), "scan object")
			o.events = a.count(o.kind, authorized)
			objects[payment.FormatID(q.prefix, o.aggregate)] = o
		}
		must(t, rows.Err(), "select objects")
	}
	return objects
}

// settlementEvents are the events that end an authorization's hold, by the
// status they leave the charge in.
var settlementEvents = map[string]string{
	"charge.succeeded": payment.EventChargeCaptured,
	"charge.voided":    payment.EventChargeVoided,
	"charge.expired":   payment.EventChargeExpired,
}

// count counts an object of kind and returns the events it must have.
func (a *audit) count(kind string, authorization bool) []string {
	switch kind {
	case "account":
		a.accounts++
		return []string{payment.EventAccountCreated}
	case "deposit":
		a.deposits++
		return []string{payment.EventDepositCreated}
	case "refund":
		a.refunds++
		return []string{payment.EventRefundCreated}
	}
	a.charges++
	if kind == "charge.failed" {
		a.failed++
	}
	if !authorization {
		return []string{kind} // charge.succeeded, charge.failed
	}
	a.authorizations++
	switch kind {
	case "charge.succeeded":
		a.captured++
	case "charge.voided":
		a.voided++
	case "charge.expired":
		a.expired++
	}
	if settled, ok := settlementEvents[kind]; ok {
		return []string{payment.EventChargeAuthorized, settled}
	}
	return []string{payment.EventChargeAuthorized} // still authorized
}

// checkKeys holds every key against the objects: a 201 or 402 names the one
// object it created; a 200 is a capture or a void, stored once per
// authorization it settled, saying what the charge became.
func (a *audit) checkKeys(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID, objects map[string]object) {
	t.Helper()
	refs, settles := map[string]int{}, map[string]int{}
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
		if *status == http.StatusOK {
			var c struct {
				ID             string `json:"id"`
				Status         string `json:"status"`
				AmountCaptured int64  `json:"amount_captured"`
			}
			_ = json.Unmarshal(body, &c)
			if o, ok := objects[c.ID]; !ok || !o.authorization() || o.kind != "charge."+c.Status || o.captured != c.AmountCaptured {
				a.badSettleKeys++
				continue
			}
			settles[c.ID]++
			continue
		}
		id := objectOf(int(*status), body)
		if id == "" {
			continue // a stored refusal (404, 409, 422, …) names no object
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
		// A capture or a void answered 200 once; an expiry by no key.
		want := 0
		if o.authorization() && (o.kind == "charge.succeeded" || o.kind == "charge.voided") {
			want = 1
		}
		if settles[id] != want {
			a.badSettleKeys++
		}
	}
}

// checkEvents checks, in commit order, that every object has each of its
// events once, describing it, that no authorization was settled twice or
// before it was authorized, and that there are no other events.
func (a *audit) checkEvents(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID, objects map[string]object) {
	t.Helper()
	byAggregate := map[uuid.UUID]object{}
	for _, o := range objects {
		byAggregate[o.aggregate] = o
	}
	described := map[uuid.UUID]map[string]int{}
	rows, err := db.Query(ctx, `SELECT aggregate_id, type, coalesce((payload->>'amount')::bigint, 0)
FROM events WHERE merchant_id = $1 ORDER BY tx_id, seq`, mid)
	must(t, err, "select events")
	for rows.Next() {
		var (
			aggregate uuid.UUID
			typ       string
			amount    int64
		)
		must(t, rows.Scan(&aggregate, &typ, &amount), "scan event")
		a.events++
		seen := described[aggregate]
		if seen == nil {
			seen = map[string]int{}
			described[aggregate] = seen
		}
		if isSettlement(typ) {
			if seen[payment.EventChargeAuthorized] == 0 {
				a.settledBeforeAuth++
			}
			for _, other := range settlementEvents {
				if seen[other] > 0 {
					a.settledTwice++
					break
				}
			}
		}
		seen[typ]++
		o, ok := byAggregate[aggregate]
		if !ok || !slices.Contains(o.events, typ) || o.amount != amount {
			a.strayEvents++
		}
	}
	must(t, rows.Err(), "select events")
	for _, o := range objects {
		for _, typ := range o.events {
			if described[o.aggregate][typ] != 1 {
				a.missingEvents++
			}
		}
	}
}

func isSettlement(eventType string) bool {
	for _, e := range settlementEvents {
		if e == eventType {
			return true
		}
	}
	return false
}

// checkMoney checks that balance = deposits − captured amounts + refunds, that
// every charge's refunds add up to its amount_refunded, and that held is the
// sum of the account's charges in status authorized.
func (a *audit) checkMoney(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID) {
	t.Helper()
	must(t, db.QueryRow(ctx, `
SELECT count(*), coalesce(sum(abs(balance - (deposited - charged + refunded))), 0) FROM (
    SELECT a.balance,
           coalesce((SELECT sum(amount) FROM deposits d WHERE d.merchant_id = a.merchant_id AND d.account_id = a.id), 0) AS deposited,
           coalesce((SELECT sum(amount_captured) FROM charges c WHERE c.merchant_id = a.merchant_id AND c.account_id = a.id), 0) AS charged,
           coalesce((SELECT sum(amount) FROM refunds r WHERE r.merchant_id = a.merchant_id AND r.account_id = a.id), 0) AS refunded
    FROM accounts a WHERE a.merchant_id = $1) m
WHERE balance <> deposited - charged + refunded`, mid).Scan(&a.badBalances, &a.balanceGap), "check balances")
	must(t, db.QueryRow(ctx, `
SELECT count(*) FROM charges c WHERE merchant_id = $1 AND amount_refunded <>
    coalesce((SELECT sum(amount) FROM refunds r WHERE r.merchant_id = c.merchant_id AND r.charge_id = c.id), 0)`,
		mid).Scan(&a.badRefundTotals), "check refund totals")
	must(t, db.QueryRow(ctx, `
SELECT count(*) FROM accounts a WHERE merchant_id = $1 AND held <>
    coalesce((SELECT sum(amount) FROM charges c WHERE c.merchant_id = a.merchant_id AND c.account_id = a.id AND c.status = 'authorized'), 0)`,
		mid).Scan(&a.badHolds), "check holds")
}

// objectOf returns the id of the object a stored response names: the created
// object of a 201, the failed charge of a 402, "" otherwise. A webhook
// endpoint (we_) is "": it is no object of the ledger the audit holds keys
// against (the webhook scenarios judge endpoints themselves).
func objectOf(status int, body []byte) string {
	var v struct {
		ID       string `json:"id"`
		ChargeID string `json:"charge_id"`
	}
	_ = json.Unmarshal(body, &v)
	switch status {
	case http.StatusCreated:
		if strings.HasPrefix(v.ID, "we_") {
			return ""
		}
		return v.ID
	case http.StatusPaymentRequired:
		return v.ChargeID
	}
	return ""
}

// op is one operation a client drove to a definite answer.
type op struct {
	kind     string // "charge", "refund", "deposit"; "authorize", "capture", "void"
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
// charges and the amount_captured of 200 captures, plus 201 refunds; an
// authorization or a void moves no balance). It returns the broken answers, the money the
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
		if o.answer.status == http.StatusOK && o.kind == "capture" {
			var v struct {
				AmountCaptured int64 `json:"amount_captured"`
			}
			_ = json.Unmarshal(o.answer.body, &v)
			want[o.account] -= v.AmountCaptured
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
