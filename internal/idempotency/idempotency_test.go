package idempotency

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
)

func TestCanonicalize(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"sorted members, no whitespace", `{ "b": 1, "a": [true, null, "x"] }`, `{"a":[true,null,"x"],"b":1}`},
		{"nested objects sorted", `{"z":{"y":1,"x":2}}`, `{"z":{"x":2,"y":1}}`},
		{"integer", `100`, `100`},
		{"integer with fraction zero", `100.0`, `100`},
		{"exponent form of an integer", `1e2`, `100`},
		{"fraction", `1.50`, `15e-1`},
		{"fraction in exponent form", `0.15E1`, `15e-1`},
		{"negative zero", `-0.0`, `0`},
		{"negative", `-12.5e1`, `-125`},
		{"huge exponent stays exact", `1e400`, `1e400`},
		{"21-digit integer stays plain", `123456789012345678901`, `123456789012345678901`},
		{"22-digit integer takes an exponent", `1234567890123456789012`, `1234567890123456789012e0`},
		{"long integer stays exact", `12345678901234567890123`, `12345678901234567890123e0`},
		{"escapes normalised", `"\u0041\/"`, `"A/"`},
		{"unicode kept", `"zürich"`, `"zürich"`},
		{"64 levels of arrays", strings.Repeat("[", 64) + "1" + strings.Repeat("]", 64), strings.Repeat("[", 64) + "1" + strings.Repeat("]", 64)},
		{"64 levels of objects", strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64), strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("Canonicalize(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	cases := map[string]string{
		"empty":                ``,
		"truncated":            `{"a":`,
		"trailing value":       `{} {}`,
		"duplicate member":     `{"a":1,"a":1}`,
		"invalid UTF-8":        "\"\xff\"",
		"too deep":             strings.Repeat("[", 100) + strings.Repeat("]", 100),
		"65 levels of arrays":  strings.Repeat("[", 65) + "1" + strings.Repeat("]", 65),
		"65 levels of objects": strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65),
		"bare word":            `nope`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if got, err := Canonicalize([]byte(in)); err == nil {
				t.Errorf("Canonicalize(%q) = %s, want an error", in, got)
			}
		})
	}
}

func TestFingerprintIgnoresFormattingOnly(t *testing.T) {
	fp := func(method, path, body string) Fingerprint {
		c, err := Canonicalize([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return NewFingerprint(method, path, c)
	}
	base := fp("POST", "/v1/charges", `{"amount":100,"currency":"USD"}`)
	if fp("POST", "/v1/charges", "{\n \"currency\" : \"USD\", \"amount\" : 1e2 }") != base {
		t.Error("reordered, reformatted body changed the fingerprint")
	}
	for name, other := range map[string]Fingerprint{
		"amount": fp("POST", "/v1/charges", `{"amount":101,"currency":"USD"}`),
		"path":   fp("POST", "/v1/accounts", `{"amount":100,"currency":"USD"}`),
		"method": fp("PUT", "/v1/charges", `{"amount":100,"currency":"USD"}`),
	} {
		if other == base {
			t.Errorf("a different %s gave the same fingerprint", name)
		}
	}
}

func TestParseKey(t *testing.T) {
	id := uuid.NewString()
	cases := []struct {
		name   string
		values []string
		key    string // the key named, when accepted
		err    error
		detail string // what the refusal's message says
	}{
		{"uuid", []string{id}, id, nil, ""},
		{"all visible ASCII", []string{"!~azAZ09-_.:/"}, "!~azAZ09-_.:/", nil, ""},
		{"255 bytes", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), nil, ""},
		{"bare with a quote and a backslash inside", []string{`k"1\2`}, `k"1\2`, nil, ""},
		{"bare ending with a quote", []string{`abc"`}, `abc"`, nil, ""},
		{"absent", nil, "", ErrKeyMissing, ""},
		{"empty", []string{""}, "", ErrKeyInvalid, "empty"},
		{"256 bytes", []string{strings.Repeat("k", 256)}, "", ErrKeyInvalid, "256 characters long"},
		{"space", []string{"a b"}, "", ErrKeyInvalid, "a space at position 2"},
		{"tab", []string{"a\tb"}, "", ErrKeyInvalid, "a tab at position 2"},
		{"non-ASCII", []string{"ключ"}, "", ErrKeyInvalid, "not ASCII"},
		{"sent twice", []string{"a", "b"}, "", ErrKeyInvalid, "sent 2 times"},

		{"quoted", []string{`"abc"`}, "abc", nil, ""},
		{"quoted uuid", []string{`"` + id + `"`}, id, nil, ""},
		{"quoted with escapes", []string{`"k\"1\\2"`}, `k"1\2`, nil, ""},
		{"quoted, starting with a quote", []string{`"\"abc"`}, `"abc`, nil, ""},
		{"quoted, spaces after", []string{"\"abc\" \t "}, "abc", nil, ""},
		{"quoted 255 bytes", []string{`"` + strings.Repeat("k", 255) + `"`}, strings.Repeat("k", 255), nil, ""},
		{"quoted 255 escapes", []string{`"` + strings.Repeat(`\\`, 255) + `"`}, strings.Repeat(`\`, 255), nil, ""},
		{"quoted 256 bytes", []string{`"` + strings.Repeat("k", 256) + `"`}, "", ErrKeyInvalid, "256 characters long"},
		{"no closing quote", []string{`"abc`}, "", ErrKeyInvalid, "no closing quote"},
		{"a lone quote", []string{`"`}, "", ErrKeyInvalid, "no closing quote"},
		{"the closing quote escaped", []string{`"abc\"`}, "", ErrKeyInvalid, "no closing quote"},
		{"a backslash at the end", []string{`"abc\`}, "", ErrKeyInvalid, "no closing quote"},
		{"escape of a letter", []string{`"a\bc"`}, "", ErrKeyInvalid, `a backslash before 'b'`},
		{"escape of a space", []string{`"a\ b"`}, "", ErrKeyInvalid, "a backslash before a space"},
		{"text after the string", []string{`"abc"d`}, "", ErrKeyInvalid, "after the closing quote"},
		{"parameters", []string{`"abc";a=1`}, "", ErrKeyInvalid, "after the closing quote"},
		{"a list of strings", []string{`"a", "b"`}, "", ErrKeyInvalid, "after the closing quote"},
		{"empty string", []string{`""`}, "", ErrKeyInvalid, "empty string"},
		{"tab inside", []string{"\"a\tb\""}, "", ErrKeyInvalid, "a tab, outside 0x20-0x7E"},
		{"DEL inside", []string{"\"a\x7fb\""}, "", ErrKeyInvalid, "0x7F, outside"},
		{"non-ASCII inside", []string{`"clé"`}, "", ErrKeyInvalid, "0xC3 (not ASCII), outside"},
		{"space inside", []string{`"a b"`}, "", ErrKeyInvalid, "quoted Idempotency-Key has a space at position 2"},
		{"quoted twice", []string{`"\"abc\""`}, `"abc"`, nil, ""},
		{"quoted, sent twice", []string{`"a"`, `"a"`}, "", ErrKeyInvalid, "sent 2 times"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.values {
				h.Add(Header, v)
			}
			got, err := ParseKey(h)
			if !errors.Is(err, tc.err) {
				t.Fatalf("ParseKey(%q) = %q, %v; want error %v", tc.values, got, err, tc.err)
			}
			if err == nil && got != tc.key {
				t.Errorf("ParseKey(%q) = %q, want %q", tc.values, got, tc.key)
			}
			if err != nil && !strings.Contains(err.Error(), tc.detail) {
				t.Errorf("ParseKey(%q): %q does not say %q", tc.values, err, tc.detail)
			}
		})
	}
}

func TestKeyHashHidesKeyAndSeparatesMerchants(t *testing.T) {
	a, b := uuid.New(), uuid.New()
	key := "order-1234567890"
	if h := KeyHash(a, key); strings.Contains(h, key) || len(h) != 16 {
		t.Errorf("KeyHash = %q", h)
	}
	if KeyHash(a, key) == KeyHash(b, key) {
		t.Error("two merchants' equal keys hash alike")
	}
}

func TestReplay(t *testing.T) {
	req := Request{Key: "k", Fingerprint: Fingerprint{1}}
	resp := Response{Status: 201, Location: "/v1/charges/ch_1", Body: []byte("{}")}
	res, err := Replay(req, Fingerprint{1}, resp)
	if err != nil || !res.Replayed || res.Status != 201 || string(res.Body) != "{}" {
		t.Errorf("Replay = %+v, %v", res, err)
	}
	if _, err := Replay(req, Fingerprint{2}, resp); !errors.Is(err, ErrKeyReused) {
		t.Errorf("Replay with another fingerprint: %v, want ErrKeyReused", err)
	}
}
