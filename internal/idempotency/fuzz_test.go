package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
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
		variant := respell(t, in)
		canonicalVariant, err := Canonicalize(variant)
		if err != nil || !bytes.Equal(canonicalVariant, out) {
			t.Fatalf("%q and its respelling %q canonicalise to %q and %q (%v)", in, variant, out, canonicalVariant, err)
		}
		if NewFingerprint("POST", "/v1/charges", out) != NewFingerprint("POST", "/v1/charges", canonicalVariant) {
			t.Fatalf("%q and %q: same canonical form, different fingerprints", in, variant)
		}
	})
}

// respell writes the JSON document in body another way that means the same:
// members in reverse order, other whitespace, every character of a string
// as a \u escape, numbers with a zero fraction and an exponent added.
func respell(t *testing.T, body []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out bytes.Buffer
	var value func(out *bytes.Buffer) error
	value = func(out *bytes.Buffer) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch v := tok.(type) {
		case json.Delim:
			var items [][]byte
			for dec.More() {
				var item bytes.Buffer
				if v == '{' {
					key, err := dec.Token()
					if err != nil {
						return err
					}
					escapeAll(&item, key.(string))
					item.WriteString(" :\r\n ")
				}
				if err := value(&item); err != nil {
					return err
				}
				items = append(items, item.Bytes())
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			if v == '{' {
				slices.Reverse(items)
			}
			out.WriteString(string(v) + "\n\t")
			out.Write(bytes.Join(items, []byte(" ,\n")))
			out.WriteString(map[json.Delim]string{'{': " }", '[': " ]"}[v])
		case string:
			escapeAll(out, v)
		case json.Number:
			mantissa, exp, hasExp := strings.Cut(strings.ToLower(string(v)), "e")
			if !strings.Contains(mantissa, ".") {
				mantissa += ".0"
			}
			if !hasExp {
				exp = "0"
			}
			out.WriteString(mantissa + "0E" + exp)
		case bool:
			out.WriteString(strconv.FormatBool(v))
		case nil:
			out.WriteString("null")
		}
		return nil
	}
	if err := value(&out); err != nil {
		t.Fatalf("respell %q: %v", body, err)
	}
	return out.Bytes()
}

// escapeAll writes s as a JSON string with every character escaped.
func escapeAll(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		if r > 0xffff {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(out, `\u%04x\u%04x`, hi, lo)
			continue
		}
		fmt.Fprintf(out, `\u%04X`, r)
	}
	out.WriteByte('"')
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
