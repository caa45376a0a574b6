package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	paymentsclient "github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/payment"
)

// hostileStrings look like SQL, format strings, markup or tricky Unicode. No
// NUL: PostgreSQL text cannot hold it (TestHostileInput/nul checks it apart).
var hostileStrings = []string{
	`'; DROP TABLE charges; --`,
	`' OR '1'='1`,
	`' OR 1=1 --`,
	`$$; DROP TABLE accounts; $$`,
	`$$`,
	`$1`,
	`\'; SELECT pg_sleep(10); --`,
	`"); DELETE FROM idempotency_keys; --`,
	`Robert'); DROP TABLE merchants;--`,
	`1; UPDATE accounts SET balance = 99999999 WHERE true; --`,
	`'||(SELECT string_agg(hash::text, ',') FROM api_keys)||'`,
	`/* comment */ -- comment`,
	`''''`,
	`\\x27 \x00 \u0000 E'\047'`,
	`%s%d%n%x %v {{.}} ${jndi:ldap://127.0.0.1/a}`,
	`<script>alert(1)</script>`,
	`日本語 Ελληνικά العربية 🙂 👨‍👩‍👧 🏳️‍🌈`,
	"\u202eright-to-left override\u202c and zero\u200bwidth",
	"line\u2028separator, tab\t, newline\n, CR\r, DEL\x7f",
	"4242 4242 4242 4242",
	strings.Repeat("'; DROP TABLE events; -- ", 40), // exactly 1000 runes: the longest description
}

// hostileKeys are valid Idempotency-Keys (visible ASCII) that look like SQL.
var hostileKeys = []string{
	`hostile-key-';DROP_TABLE_charges;--`,
	`hostile-key-'OR'1'='1`,
	`hostile-key-$$;DELETE_FROM_idempotency_keys;$$`,
	`hostile-key-\';SELECT_pg_sleep(10);--`,
	`hostile-key-"%00%27%s%n`,
	`hostile-key-${jndi:x}{{.}}<b>`,
}

// TestHostileInput feeds SQL-looking and otherwise hostile strings into every
// string a client controls, tries every endpoint with another merchant's ids,
// and reads the service's logs: strings are stored verbatim or refused with
// 400, never executed; another merchant's objects are 404 (a foreign list
// cursor 400) and stay untouched; no idempotency key, API key or card-like
// number is ever logged.
func TestHostileInput(t *testing.T) {
	s := startScenario(t, 60*time.Second, testDatabase, "hostile-a", "hostile-b")
	ctx, bin, dbURL, ms, db, began := s.ctx, s.bin, s.dbURL, s.merchants, s.db, s.began
	svc := newService(t, bin, serviceConfig{databaseURL: dbURL})
	base := func(int) string { return svc.url() }
	a := newClient(t, ms[0].APIKey, "hostile-key-a-", base)
	b := newClient(t, ms[1].APIKey, "hostile-key-b-", base)
	h := &hostile{t: t, ctx: ctx, db: db}
	parent := t

	// The other merchant's objects, and a snapshot of everything of theirs.
	bDesc := "b's account"
	bAcct := b.mustAccount(t, ctx, paymentsclient.NewAccount{Currency: "USD", Description: &bDesc})
	bDep := b.mustDeposit(t, ctx, bAcct, 10000)
	bCharge := b.mustCharge(t, ctx, bAcct, 3000)
	bRefund := b.mustRefund(t, ctx, bCharge, 1000)
	bEvent := b.awaitEvents(t, ctx, 1)[0]
	bBefore := h.snapshot(ms[1].ID)
	crossMerchant := 0

	aAcct := a.mustAccount(t, ctx, usd)
	a.mustDeposit(t, ctx, aAcct, 100000)

	t.Run("strings", func(t *testing.T) {
		h.t = t
		defer func() { h.t = parent }()
		for i, s := range hostileStrings {
			metaKey := s
			if utf8.RuneCountInString(metaKey) > payment.MaxMetadataKeyLength {
				metaKey = string([]rune(metaKey)[:payment.MaxMetadataKeyLength])
			}
			meta := map[string]string{metaKey: s, "n": fmt.Sprint(i)}
			if utf8.RuneCountInString(s) > payment.MaxMetadataValueLen {
				meta[metaKey] = string([]rune(s)[:payment.MaxMetadataValueLen])
			}
			body := jsonOf(t, map[string]any{"currency": "USD", "description": s, "metadata": meta})
			acct := h.storedVerbatim(a, "/v1/accounts", body, "accounts", s, meta)
			h.storedVerbatim(a, "/v1/charges", jsonOf(t, map[string]any{
				"account_id": aAcct, "amount": 1, "currency": "USD", "description": s, "metadata": meta,
			}), "charges", s, meta)
			if acct == "" {
				continue
			}

			// Where an id, a currency or a list parameter is expected, the
			// string is refused or names nothing.
			esc := url.PathEscape(s)
			h.expect(a.post(t, ctx, "/v1/charges", a.newKey(), jsonOf(t, map[string]any{"account_id": s, "amount": 1, "currency": "USD"})), 400)
			h.expect(a.post(t, ctx, "/v1/charges", a.newKey(), jsonOf(t, map[string]any{"account_id": aAcct, "amount": 1, "currency": s})), 400)
			h.expect(a.post(t, ctx, "/v1/accounts", a.newKey(), jsonOf(t, map[string]any{"currency": s})), 400)
			h.expect(a.get(t, ctx, "/v1/accounts/"+esc), 404)
			h.expect(a.get(t, ctx, "/v1/charges/"+esc), 404)
			h.expect(a.get(t, ctx, "/v1/accounts/"+acct+"/deposits/"+esc), 404)
			// A POST whose path is escaped otherwise than Go escapes it (its
			// routed and its fingerprinted form would differ) is refused
			// (400) before its key is claimed; any other names nothing (404).
			postRefusal := 404
			if u, err := url.Parse("/v1/accounts/" + esc); err != nil || u.RawPath != "" {
				postRefusal = 400
			}
			h.expect(a.post(t, ctx, "/v1/accounts/"+esc+"/deposits", a.newKey(), `{"amount":1}`), postRefusal)
			h.expect(a.post(t, ctx, "/v1/charges/"+esc+"/refunds", a.newKey(), `{}`), postRefusal)
			q := url.QueryEscape(s)
			h.expect(a.get(t, ctx, "/v1/charges?account_id="+q), 400)
			h.expect(a.get(t, ctx, "/v1/charges?starting_after="+q), 400)
			h.expect(a.get(t, ctx, "/v1/charges?limit="+q), 400)
			h.expect(a.get(t, ctx, "/v1/events?starting_after="+q), 400)
			h.expect(a.get(t, ctx, "/v1/charges?"+q+"=1"), 400)
			// As an Idempotency-Key: refused unless visible ASCII. (Go's
			// client will not send control characters in a header at all.)
			if !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
				want := 400
				if validKey(s) {
					want = 201
				}
				h.expect(a.post(t, ctx, "/v1/charges", s, string(chargeBody(aAcct, 1))), want)
			}
		}
		for _, k := range hostileKeys {
			body := string(chargeBody(aAcct, 2))
			first := a.post(t, ctx, "/v1/charges", k, body)
			h.expect(first, 201)
			again := a.post(t, ctx, "/v1/charges", k, body)
			if !bytes.Equal(again.body, first.body) || !again.replayed() {
				h.violation("key %q: the retry got %d %s, not the replay of %s", k, again.status, again.body, first.body)
			}
			var stored int
			must(t, db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, k).Scan(&stored), "count key")
			if stored != 1 {
				h.violation("key %q is stored %d times, want once, verbatim", k, stored)
			}
		}
	})

	t.Run("nul", func(t *testing.T) {
		h.t = t
		defer func() { h.t = parent }()
		// PostgreSQL text cannot hold NUL, so a NUL must be refused before
		// it reaches the database: a 400, not a 500.
		for _, tc := range []struct{ path, body string }{
			{"/v1/accounts", `{"currency":"USD","description":"a\u0000b"}`},
			{"/v1/accounts", `{"currency":"USD","metadata":{"k":"a\u0000b"}}`},
			{"/v1/accounts", `{"currency":"USD","metadata":{"a\u0000b":"v"}}`},
			{"/v1/charges", `{"account_id":"` + aAcct + `","amount":1,"currency":"USD","description":"\u0000"}`},
		} {
			body := tc.body
			got := a.post(t, ctx, tc.path, a.newKey(), body)
			if !h.expect(got, 400) {
				t.Logf("body %s; the service logged: %s", body, logLine(svc.logs.String(), got.header.Get("X-Request-Id"), "request failed"))
			}
		}
	})

	t.Run("other merchant", func(t *testing.T) {
		h.t = t
		defer func() { h.t = parent }()
		nobody := func(prefix string) string { return payment.FormatID(prefix, uuid.New()) }
		cases := []struct {
			name, method, path, body string
			want                     int
		}{
			{"get account", "GET", "/v1/accounts/" + bAcct, "", 404},
			{"get deposit", "GET", "/v1/accounts/" + bAcct + "/deposits/" + bDep, "", 404},
			{"get deposit via own account", "GET", "/v1/accounts/" + aAcct + "/deposits/" + bDep, "", 404},
			{"get charge", "GET", "/v1/charges/" + bCharge, "", 404},
			{"get refund", "GET", "/v1/charges/" + bCharge + "/refunds/" + bRefund, "", 404},
			{"deposit", "POST", "/v1/accounts/" + bAcct + "/deposits", `{"amount":5}`, 404},
			{"refund", "POST", "/v1/charges/" + bCharge + "/refunds", `{}`, 404},
			{"partial refund", "POST", "/v1/charges/" + bCharge + "/refunds", `{"amount":1}`, 404},
			{"charge", "POST", "/v1/charges", string(chargeBody(bAcct, 5)), 404},
			{"list after charge", "GET", "/v1/charges?starting_after=" + bCharge, "", 400},
			{"list after event", "GET", "/v1/events?starting_after=" + bEvent, "", 400},
		}
		for _, tc := range cases {
			crossMerchant += 2
			for try := range 2 { // a retry answers the same
				var got answer
				if tc.method == "GET" {
					got = a.get(t, ctx, tc.path)
				} else {
					got = a.post(t, ctx, tc.path, a.newKey(), tc.body)
				}
				if !h.expect(got, tc.want) {
					continue
				}
				if strings.Contains(string(got.body), "b's account") || strings.Contains(string(got.body), `"amount":3000`) {
					h.violation("%s (try %d): the answer shows merchant b's data: %s", tc.name, try, got.body)
				}
			}
		}
		// A filter by another merchant's account is a 404, exactly as a filter
		// by an account that does not exist (but for the id it names).
		crossMerchant++
		unknownAcct := nobody(payment.PrefixAccount)
		foreign := a.get(t, ctx, "/v1/charges?account_id="+bAcct)
		unknown := a.get(t, ctx, "/v1/charges?account_id="+unknownAcct)
		if foreign.status != 404 || unknown.status != 404 ||
			!bytes.Equal(bytes.ReplaceAll(foreign.body, []byte(bAcct), []byte(unknownAcct)), unknown.body) {
			h.violation("list by merchant b's account: %d %s; by an unknown account: %d %s", foreign.status, foreign.body, unknown.status, unknown.body)
		} else {
			t.Logf("list by another merchant's account_id: %d %s (the same as for an account that does not exist)", foreign.status, bytes.TrimSpace(foreign.body))
		}
		// Keys are per merchant: a's request with b's key is a's own.
		bKey := b.newKey()
		b.post(t, ctx, "/v1/charges", bKey, string(chargeBody(bAcct, 7)))
		h.expect(a.post(t, ctx, "/v1/charges", bKey, string(chargeBody(bAcct, 7))), 404)
		b.post(t, ctx, "/v1/charges/"+bCharge+"/refunds", b.newKey(), `{"amount":7}`) // undo, so b's snapshot is comparable
		bAfter := h.snapshot(ms[1].ID)
		// b's own charge and refund above are the only changes allowed.
		bBefore.charges++
		bBefore.refunds++
		bBefore.keys += 2
		bBefore.events += 2
		bBefore.refunded += 7
		bBefore.charged += 7
		if bAfter != bBefore {
			h.violation("merchant b's data changed:\nbefore %+v\nafter  %+v", bBefore, bAfter)
		}
	})

	t.Run("logs", func(t *testing.T) {
		h.t = t
		defer func() { h.t = parent }()
		// A wrong API key, which must not be logged either.
		bogus := newClient(t, "sk_bogus-secret-never-logged", "hostile-key-c-", base)
		h.expect(bogus.get(t, ctx, "/v1/charges"), 401)
		logs := svc.logs.String()
		secrets := append([]string{"hostile-key-", ms[0].APIKey, ms[1].APIKey, "sk_bogus", "4242 4242 4242 4242", "4242424242424242"}, hostileKeys...)
		if leaked := logsMention(logs, secrets...); len(leaked) > 0 {
			h.violation("the service logged %q", leaked)
		}
		t.Logf("%d log lines checked", svc.logs.Lines())
	})

	// Every table is still there and still holds its rows.
	var missing []string
	for _, table := range []string{"merchants", "api_keys", "accounts", "deposits", "charges", "refunds", "idempotency_keys", "events", "inbox", "account_balances"} {
		var exists bool
		must(t, db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "public."+table).Scan(&exists), "table %s", table)
		if !exists {
			missing = append(missing, table)
		}
	}
	if len(missing) > 0 {
		h.violation("tables gone: %v", missing)
	}
	audA := auditDatabase(t, ctx, db, ms[0].ID)
	audA.report(t)
	audB := auditDatabase(t, ctx, db, ms[1].ID)
	audB.report(t)
	t.Logf("%d requests: answers by status %v", a.stats.requests.Load()+b.stats.requests.Load(), h.statuses)

	summary{
		scenario: "hostile input (SQL-looking strings, other merchant's ids)",
		requests: a.stats.requests.Load() + b.stats.requests.Load(),
		faults: fmt.Sprintf("%d hostile strings in every field, %d hostile keys, %d requests for another merchant's objects",
			len(hostileStrings), len(hostileKeys), crossMerchant+3),
		duplicates: audA.duplicateCharges + audB.duplicateCharges,
		lost:       int(audA.balanceGap+audB.balanceGap) + audA.missingEvents + audB.missingEvents,
		violations: h.violations + audA.violations() + audB.violations(),
		command:    reproduce("TestHostileInput"),
	}.log(t, time.Since(began))
}

// hostile carries the checks of TestHostileInput.
type hostile struct {
	t          *testing.T
	ctx        context.Context
	db         *pgxpool.Pool
	violations int
	statuses   map[int]int
}

func (h *hostile) violation(format string, args ...any) {
	h.t.Helper()
	h.violations++
	h.t.Errorf(format, args...)
}

// expect checks an answer's status; it reports whether it matched.
func (h *hostile) expect(a answer, want int) bool {
	h.t.Helper()
	if h.statuses == nil {
		h.statuses = map[int]int{}
	}
	h.statuses[a.status]++
	if a.status != want {
		h.violation("got %d %s, want %d", a.status, bytes.TrimSpace(a.body), want)
		return false
	}
	return true
}

// storedVerbatim creates an object whose description and metadata are
// hostile, then reads it back through the API and straight from table: both
// must be byte for byte what was sent. It returns the object's id.
func (h *hostile) storedVerbatim(c *client, path, body, table, description string, metadata map[string]string) string {
	h.t.Helper()
	got := c.post(h.t, h.ctx, path, c.newKey(), body)
	if !h.expect(got, 201) {
		return ""
	}
	id := got.field("id")
	read := c.get(h.t, h.ctx, got.header.Get("Location"))
	var obj struct {
		Description *string
		Metadata    map[string]string
	}
	_ = json.Unmarshal(read.body, &obj)
	if read.status != 200 || obj.Description == nil || *obj.Description != description || !equalMaps(obj.Metadata, metadata) {
		h.violation("GET %s: %d %s; want description %q and metadata %q", id, read.status, read.body, description, metadata)
	}
	_, raw, _ := strings.Cut(id, "_")
	var (
		stored string
		meta   map[string]string
	)
	must(h.t, h.db.QueryRow(h.ctx, `SELECT description, metadata FROM `+table+` WHERE id = $1`, raw).Scan(&stored, &meta), "read %s", id)
	if stored != description || !equalMaps(meta, metadata) {
		h.violation("%s %s holds description %q metadata %q; sent %q %q", table, id, stored, meta, description, metadata)
	}
	return id
}

// bSnapshot is everything of a merchant that another merchant's requests
// could change.
type bSnapshot struct {
	accounts, deposits, charges, refunds, keys, events int
	balance, charged, refunded                         int64
}

func (h *hostile) snapshot(merchantID string) bSnapshot {
	h.t.Helper()
	var s bSnapshot
	must(h.t, h.db.QueryRow(h.ctx, `
SELECT (SELECT count(*) FROM accounts WHERE merchant_id = $1),
       (SELECT count(*) FROM deposits WHERE merchant_id = $1),
       (SELECT count(*) FROM charges WHERE merchant_id = $1),
       (SELECT count(*) FROM refunds WHERE merchant_id = $1),
       (SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1),
       (SELECT count(*) FROM events WHERE merchant_id = $1),
       (SELECT coalesce(sum(balance), 0) FROM accounts WHERE merchant_id = $1),
       (SELECT coalesce(sum(amount_captured), 0) FROM charges WHERE merchant_id = $1),
       (SELECT coalesce(sum(amount_refunded), 0) FROM charges WHERE merchant_id = $1)`, merchantID).
		Scan(&s.accounts, &s.deposits, &s.charges, &s.refunds, &s.keys, &s.events, &s.balance, &s.charged, &s.refunded), "snapshot")
	return s
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	must(t, err, "marshal")
	return string(b)
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// validKey mirrors the Idempotency-Key syntax for a bare key: 1–255 visible
// ASCII characters, the first not a double quote (a value that starts with
// one is read as a quoted string; none of hostileStrings is a well-formed one).
func validKey(s string) bool {
	if len(s) == 0 || len(s) > 255 || s[0] == '"' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// logLine returns the first log line that mentions both needles.
func logLine(logs, a, b string) string {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, a) && strings.Contains(line, b) {
			return strings.TrimSpace(line)
		}
	}
	return "(nothing)"
}
