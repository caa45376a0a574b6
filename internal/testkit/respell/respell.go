// Package respell writes a JSON document another way that means the same,
// for the fuzz tests of the key contract and of request decoding. It imports
// nothing of this module, so that any package's own tests may use it.
package respell

import (
	"bytes"
	"encoding/json"
	"strings"
)

// All writes the JSON document in body another way that means the same:
// members in
// reverse order, other whitespace, every string character as a \u escape, and
// numbers with a zero fraction and an exponent added (1 → 1.00E0). Member
// names keep their case: encoding/json would match "Amount" to amount, but it
// is a different name, and so a different document.
func All(body []byte) ([]byte, error) { return respell(body, true) }

// KeepingNumbers is All with the numbers written as they are.
func KeepingNumbers(body []byte) ([]byte, error) { return respell(body, false) }

func respell(body []byte, numbers bool) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out bytes.Buffer
	if err := respellValue(dec, &out, numbers); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func respellValue(dec *json.Decoder, out *bytes.Buffer, numbers bool) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return respellArray(dec, out, numbers)
		}
		return respellObject(dec, out, numbers)
	case string:
		escapeAll(out, v)
	case json.Number:
		if !numbers {
			out.WriteString(string(v))
			break
		}
		mantissa, exp, hasExp := strings.Cut(strings.ToLower(string(v)), "e")
		if !strings.Contains(mantissa, ".") {
			mantissa += ".0"
		}
		if !hasExp {
			exp = "0"
		}
		out.WriteString(mantissa + "0E" + exp)
	case bool:
		out.WriteString(map[bool]string{true: "true", false: "false"}[v])
	case nil:
		out.WriteString("null")
	}
	return nil
}

func respellArray(dec *json.Decoder, out *bytes.Buffer, numbers bool) error {
	out.WriteString("[ ")
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteString(" ,\n")
		}
		if err := respellValue(dec, out, numbers); err != nil {
			return err
		}
	}
	_, err := dec.Token()
	out.WriteString("\t]")
	return err
}

func respellObject(dec *json.Decoder, out *bytes.Buffer, numbers bool) error {
	var members [][]byte
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		var m bytes.Buffer
		escapeAll(&m, key.(string))
		m.WriteString(" :\r\n ")
		if err := respellValue(dec, &m, numbers); err != nil {
			return err
		}
		members = append(members, m.Bytes())
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	out.WriteString("{\n")
	for i := len(members) - 1; i >= 0; i-- {
		out.Write(members[i])
		if i > 0 {
			out.WriteString(",  ")
		}
	}
	out.WriteString("\n}")
	return nil
}

// escapeAll writes s as a JSON string with every character escaped, those
// beyond the Basic Multilingual Plane as UTF-16 surrogate pairs.
func escapeAll(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		if r > 0xffff {
			r -= 0x10000
			writeEscape(out, 0xd800+(r>>10))
			writeEscape(out, 0xdc00+(r&0x3ff))
			continue
		}
		writeEscape(out, r)
	}
	out.WriteByte('"')
}

func writeEscape(out *bytes.Buffer, r rune) {
	const hex = "0123456789abcdef"
	out.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		out.WriteByte(hex[(r>>shift)&0xf])
	}
}
