package httpapi_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestQuotedAndBareKeysNameTheSameKey: an Idempotency-Key sent as a
// Structured Field string ("abc", the IETF draft's form) and sent bare (abc)
// name one key, so a request retried by a client of the other convention
// executes once and is answered with the first answer's bytes.
func TestQuotedAndBareKeysNameTheSameKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	accounts := func() int { return f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1`) }

	const body = `{"currency":"USD"}`
	first := f.post("/v1/accounts", `"abc"`, body)
	if first.status != http.StatusCreated {
		t.Fatalf("quoted key: %d %s", first.status, first.body)
	}
	again := f.post("/v1/accounts", `abc`, body)
	if again.status != first.status || !bytes.Equal(again.body, first.body) ||
		again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("bare key after the quoted one: %d %s (Location %q, Idempotent-Replayed %q); want the replay of %d %s",
			again.status, again.body, again.header.Get("Location"), again.header.Get("Idempotent-Replayed"), first.status, first.body)
	}
	if n := accounts(); n != 1 {
		t.Errorf("%d accounts, want 1: the two spellings executed twice", n)
	}
	if n := f.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1 AND key = 'abc'`); n != 1 || f.keys() != 1 {
		t.Errorf("key rows: %d named abc of %d, want the one key abc", n, f.keys())
	}

	// The other way round, on the charge path, with the two escapes: the bare
	// key k"1\2 is the quoted "k\"1\\2".
	acct := f.account("USD", 1000)
	bare := f.post("/v1/charges", `k"1\2`, chargeBody(acct, 300))
	if bare.status != http.StatusCreated {
		t.Fatalf("bare key with a quote and a backslash: %d %s", bare.status, bare.body)
	}
	quoted := f.post("/v1/charges", `"k\"1\\2"`, chargeBody(acct, 300))
	if quoted.status != bare.status || !bytes.Equal(quoted.body, bare.body) || quoted.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("quoted key after the bare one: %d %s, want the replay of %d %s", quoted.status, quoted.body, bare.status, bare.body)
	}
	if n, b := f.charges(), f.balance(acct); n != 1 || b != 700 {
		t.Errorf("%d charges, balance %d; want 1 charge and 700", n, b)
	}
	f.checkLedger(acct)
}

// TestMalformedQuotedKeyIsRefused: a key that starts with a quote but is not
// a well-formed Structured Field string, or whose content is not a valid key,
// is a 400 naming what is wrong, found before any key is claimed.
func TestMalformedQuotedKeyIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	accounts := func() int { return f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1`) }
	keysBefore, accountsBefore := f.keys(), accounts()

	for _, tc := range []struct {
		name, key, detail string
	}{
		{"no closing quote", `"abc`, "closing quote"},
		{"a lone quote", `"`, "closing quote"},
		{"escape of another character", `"a\bc"`, `backslash`},
		{"escape at the end", `"abc\`, `closing quote`},
		{"text after the closing quote", `"abc"x`, "after the closing quote"},
		{"parameters", `"abc";p=1`, "after the closing quote"},
		{"two strings", `"a" "b"`, "after the closing quote"},
		{"empty string", `""`, "empty"},
		{"not ASCII", `"clé"`, "0x20"},
		{"space inside", `"a b"`, "space"},
		{"too long", `"` + strings.Repeat("k", 256) + `"`, "255"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/v1/accounts", "/v1/charges"} {
				body := `{"currency":"USD"}`
				if path == "/v1/charges" {
					body = chargeBody(acct, 100)
				}
				r := f.post(path, tc.key, body)
				if r.status != http.StatusBadRequest || r.code(t) != "idempotency-key-invalid" {
					t.Fatalf("POST %s with Idempotency-Key %s: %d %s, want 400 idempotency-key-invalid", path, tc.key, r.status, r.body)
				}
				if detail, _ := r.json(t)["detail"].(string); !strings.Contains(detail, tc.detail) {
					t.Errorf("detail %q does not say %q", detail, tc.detail)
				}
			}
		})
	}
	if k, a, c, b := f.keys(), accounts(), f.charges(), f.balance(acct); k != keysBefore || a != accountsBefore || c != 0 || b != 1000 {
		t.Errorf("after the refusals: %d keys, %d accounts, %d charges, balance %d; want %d, %d, 0, 1000",
			k, a, c, b, keysBefore, accountsBefore)
	}
}
