package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/internal/testkit/respell"
)

// FuzzCanonicalize: never panics; the canonical form is valid JSON, is its own
// canonical form, and means what the input meant; and the same document
// spelt another way (members in another order, other whitespace, escaped
// characters, numbers written differently) has the same canonical form and so
// the same fingerprint.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1.50,-0,1e400,"x\u00e9"]}`, `[]`, `"s"`, `{"a":{"a":{}}}`, `1E-7`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("canonical form of %q is not JSON: %q", in, out)
		}
		again, err := Canonicalize(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not stable: %q -> %q -> %q (%v)", in, out, again, err)
		}
		var meant, means any
		if json.Unmarshal(in, &meant) == nil { // numbers beyond float64 aside
			if err := json.Unmarshal(out, &means); err != nil || !reflect.DeepEqual(meant, means) {
				t.Fatalf("%q means %#v, its canonical form %q means %#v (%v)", in, meant, out, means, err)
			}
		}
		variant, err := respell.All(in)
		if err != nil {
			t.Fatalf("respell %q: %v", in, err)
		}
		canonicalVariant, err := Canonicalize(variant)
		if err != nil || !bytes.Equal(canonicalVariant, out) {
			t.Fatalf("%q and its respelling %q canonicalise to %q and %q (%v)", in, variant, out, canonicalVariant, err)
		}
		if NewFingerprint("POST", "/v1/charges", out) != NewFingerprint("POST", "/v1/charges", canonicalVariant) {
			t.Fatalf("%q and %q: same canonical form, different fingerprints", in, variant)
		}
	})
}

// FuzzParseKey: never panics; accepts a value exactly when it is a key of 1
// to 255 visible ASCII characters, bare or as a Structured Field string
// (the oracle, sfKey, reads the string with a regular expression rather than
// ParseKey's scanner), and names that key; and every key it accepts, quoted,
// names the same key again.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"", "a", "a b", "ключ", "550e8400-e29b-41d4-a716-446655440000",
		`"abc"`, `"k\"1\\2"`, `k"1\2`, `"abc`, `""`, `"a\b"`, `"abc";p=1`, "\"abc\" \t", `"a b"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseKey(http.Header{Header: {v}})
		want, ok := sfKey(v)
		if (err == nil) != ok || (err == nil && got != want) {
			t.Fatalf("ParseKey(%q) = %q, %v; want %q, accepted=%v", v, got, err, want, ok)
		}
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) refused with %v, not an ErrKeyInvalid", v, err)
			}
			return
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(got) + `"`
		if again, err := ParseKey(http.Header{Header: {quoted}}); err != nil || again != got {
			t.Fatalf("the key %q quoted, %s, parses as %q, %v", got, quoted, again, err)
		}
	})
}

var (
	sfString = regexp.MustCompile(`^"((?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\["\\])*)"[ \t]*$`)
	sfEscape = regexp.MustCompile(`\\(.)`)
)

// sfKey is the key a header value names, read independently of ParseKey: the
// value itself, or the content of the Structured Field string it is; ok
// reports whether that is 1 to 255 visible ASCII characters.
func sfKey(v string) (key string, ok bool) {
	key = v
	if strings.HasPrefix(v, `"`) {
		m := sfString.FindStringSubmatch(v)
		if m == nil {
			return "", false
		}
		key = sfEscape.ReplaceAllString(m[1], "$1")
	}
	if len(key) < 1 || len(key) > 255 {
		return "", false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", false
		}
	}
	return key, true
}
