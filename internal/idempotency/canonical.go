package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxDepth = 64

// Document is a JSON body parsed once: its canonical form, which the
// fingerprint covers, and the value it decodes to, from which a handler takes
// its fields without parsing the body again.
type Document struct {
	Canonical []byte
	// Value is nil (null), a bool, a string, a json.Number (the literal as
	// sent), an []any, or an []Member for an object, in document order.
	Value any
}

// Member is one member of a JSON object.
type Member struct {
	Name  string
	Value any
}

// Canonicalize returns the canonical form of the JSON document in body: no
// insignificant whitespace, object members sorted by key, strings re-escaped
// uniformly and numbers in one exact form per value (1, 1.0 and 10e-1 are all
// "1"; 1.5 and 15e-1 are both "15e-1"). Two documents that mean the same thing
// have the same canonical form. It rejects what is not a single well-formed
// JSON value, invalid UTF-8, duplicate object keys (their meaning is ambiguous)
// and nesting deeper than 64; the error names the problem.
func Canonicalize(body []byte) ([]byte, error) {
	doc, err := Parse(body)
	return doc.Canonical, err
}

// Parse is Canonicalize that also returns the decoded value, in one pass.
func Parse(body []byte) (Document, error) {
	if !utf8.Valid(body) {
		return Document{}, errors.New("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(body))
	v, err := canonicalValue(dec, &out, 0)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return Document{}, errors.New("body is empty or ends too early")
		}
		return Document{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Document{}, errors.New("unexpected data after the JSON value")
	}
	return Document{Canonical: out.Bytes(), Value: v}, nil
}

func canonicalValue(dec *json.Decoder, out *bytes.Buffer, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("JSON nested deeper than %d levels", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, syntaxError(err)
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return canonicalObject(dec, out, depth)
		}
		return canonicalArray(dec, out, depth)
	case string:
		writeString(out, v)
	case json.Number:
		out.WriteString(canonicalNumber(string(v)))
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	}
	return tok, nil
}

func canonicalObject(dec *json.Decoder, out *bytes.Buffer, depth int) ([]Member, error) {
	type member struct {
		key   string
		value []byte
	}
	var (
		members []member
		decoded []Member
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxError(err)
		}
		key := tok.(string) // the decoder only yields strings in key position
		var value bytes.Buffer
		v, err := canonicalValue(dec, &value, depth+1)
		if err != nil {
			return nil, err
		}
		members = append(members, member{key, value.Bytes()})
		decoded = append(decoded, Member{key, v})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, syntaxError(err)
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if members[i-1].key == m.key {
				return nil, fmt.Errorf("duplicate key %q in JSON object", m.key)
			}
			out.WriteByte(',')
		}
		writeString(out, m.key)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	if decoded == nil {
		decoded = []Member{}
	}
	return decoded, nil
}

func canonicalArray(dec *json.Decoder, out *bytes.Buffer, depth int) ([]any, error) {
	out.WriteByte('[')
	values := []any{}
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		v, err := canonicalValue(dec, out, depth+1)
		if err != nil {
			return nil, err
		}
		values = append(values, v)
	}
	if _, err := dec.Token(); err != nil { // ']'
		return nil, syntaxError(err)
	}
	out.WriteByte(']')
	return values, nil
}

func writeString(out *bytes.Buffer, s string) {
	b, _ := json.Marshal(s) // cannot fail for a valid UTF-8 string
	out.Write(b)
}

// canonicalNumber rewrites a JSON number literal exactly (no float rounding):
// an integer of up to 21 digits stays plain ("100"), anything else becomes
// significant digits without leading or trailing zeros and a decimal exponent
// ("15e-1", "1e400"). Negative zero is "0".
func canonicalNumber(lit string) string {
	neg := strings.HasPrefix(lit, "-")
	lit = strings.TrimPrefix(lit, "-")
	mantissa, expPart, _ := strings.Cut(strings.ToLower(lit), "e")
	intPart, frac, _ := strings.Cut(mantissa, ".")

	exp := new(big.Int)
	if expPart != "" {
		exp.SetString(strings.TrimPrefix(expPart, "+"), 10) // the decoder validated the digits
	}
	exp.Sub(exp, big.NewInt(int64(len(frac))))

	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	digits = trimmed

	sign := ""
	if neg {
		sign = "-"
	}
	if exp.Sign() >= 0 && exp.IsInt64() && int64(len(digits))+exp.Int64() <= 21 {
		return sign + digits + strings.Repeat("0", int(exp.Int64()))
	}
	return sign + digits + "e" + exp.String()
}

func syntaxError(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("malformed JSON at byte %d: %s", se.Offset, se.Error())
	}
	return err
}
