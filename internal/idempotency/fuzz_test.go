package idempotency

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
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

// FuzzParseKey: never panics, and accepts exactly the keys of 1 to 255 visible
// ASCII characters.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"", "a", "a b", "ключ", "550e8400-e29b-41d4-a716-446655440000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		h := http.Header{Header: {key}}
		got, err := ParseKey(h)
		want := len(key) >= 1 && len(key) <= MaxKeyLength
		for i := 0; i < len(key); i++ {
			want = want && key[i] >= 0x21 && key[i] <= 0x7e
		}
		if (err == nil) != want || (err == nil && got != key) {
			t.Fatalf("ParseKey(%q) = %q, %v; want accepted=%v", key, got, err, want)
		}
	})
}
