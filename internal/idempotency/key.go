// Package idempotency owns the Idempotency-Key contract: which keys are valid,
// how a request is fingerprinted, and what a known key means for a new request
// (replay the stored response, or refuse a different request under the same key).
// The claim itself happens in the storage layer, in the same transaction as the
// business change, so that the unique index decides who executes.
package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// MaxKeyLength is the longest key accepted, in bytes.
const MaxKeyLength = 255

// Errors from ParseKey. Every refusal of a key is an ErrKeyInvalid
// (errors.Is) whose message says what is wrong with it.
var (
	ErrKeyMissing = errors.New("the Idempotency-Key header is required on this request")
	ErrKeyInvalid = errors.New("the Idempotency-Key header must be 1 to 255 visible ASCII characters (0x21-0x7E), sent once")
)

// keyError is an ErrKeyInvalid that says what is wrong with the key.
type keyError string

func (e keyError) Error() string        { return string(e) }
func (e keyError) Is(target error) bool { return target == ErrKeyInvalid }

// ParseKey returns the request's idempotency key. The header is sent once, in
// one of two forms that name the same key:
//
//   - bare, the key itself: abc;
//   - quoted, a Structured Field string (RFC 8941, section 3.3.3), as the IETF
//     draft on the Idempotency-Key header defines it: "abc", in which \" and
//     \\ stand for " and \ and nothing else may follow a backslash.
//
// A value that starts with a double quote is always read as a string, and
// refused unless it is one, alone (optional spaces or tabs may follow it, no
// parameters). In any other value " and \ are characters of the key like any
// other: the bare k"1\2 and the quoted "k\"1\\2" name the same key, and a key
// that starts with " can be sent quoted only. Either way the key is then 1 to
// MaxKeyLength visible ASCII characters (0x21-0x7E): the quoted "a b" is
// refused, as a b is.
//
// It returns ErrKeyMissing when the header is absent, and an error that is
// ErrKeyInvalid when it is repeated, a malformed string, or a key that is
// empty, too long or not visible ASCII.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(Header)
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", keyError(fmt.Sprintf("the Idempotency-Key header is sent %d times; send it once", len(values)))
	}
	key := values[0]
	if !strings.HasPrefix(key, `"`) {
		if why := keyProblem(key); why != "" {
			return "", keyError("the Idempotency-Key " + why)
		}
		return key, nil
	}
	key, err := unquote(key)
	if err != nil {
		return "", err
	}
	if why := keyProblem(key); why != "" {
		return "", keyError("the key in the quoted Idempotency-Key " + why)
	}
	return key, nil
}

// unquote returns the content of the Structured Field string that v, which
// starts with a double quote, must be (RFC 8941, section 4.2.5), followed by
// nothing but spaces and tabs.
func unquote(v string) (string, error) {
	const unclosed = keyError(`the Idempotency-Key starts with a double quote but is not a string: it has no closing quote`)
	var b strings.Builder
	b.Grow(len(v))
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) {
				return "", unclosed
			}
			if v[i] != '"' && v[i] != '\\' {
				return "", keyError(fmt.Sprintf(`the quoted Idempotency-Key has a backslash before %s; only \" and \\ are escapes`, describeByte(v[i])))
			}
			b.WriteByte(v[i])
		case c == '"':
			if strings.TrimLeft(v[i+1:], " \t") != "" {
				return "", keyError("the quoted Idempotency-Key has more after the closing quote of its string; send the string alone, without parameters")
			}
			if b.Len() == 0 {
				return "", keyError(`the quoted Idempotency-Key is the empty string ""`)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", keyError(fmt.Sprintf("the quoted Idempotency-Key holds %s, outside 0x20-0x7E", describeByte(c)))
		default:
			b.WriteByte(c)
		}
	}
	return "", unclosed
}

// ValidKey reports whether key is 1 to MaxKeyLength visible ASCII characters.
func ValidKey(key string) bool { return keyProblem(key) == "" }

// keyProblem says what keeps key from being 1 to MaxKeyLength visible ASCII
// characters, or returns "" when it is.
func keyProblem(key string) string {
	if len(key) == 0 {
		return "is empty"
	}
	if len(key) > MaxKeyLength {
		return fmt.Sprintf("is %d characters long, over %d", len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return fmt.Sprintf("has %s at position %d; a key is 1 to %d visible ASCII characters (0x21-0x7E)",
				describeByte(key[i]), i+1, MaxKeyLength)
		}
	}
	return ""
}

// describeByte names a byte of a key for a refusal's detail.
func describeByte(c byte) string {
	switch {
	case c == ' ':
		return "a space"
	case c == '\t':
		return "a tab"
	case c < 0x20 || c == 0x7f:
		return fmt.Sprintf("the control character 0x%02X", c)
	case c > 0x7f:
		return fmt.Sprintf("the byte 0x%02X (not ASCII)", c)
	}
	return fmt.Sprintf("%q", rune(c))
}

// KeyHash returns a short, stable digest of a merchant's key for logs and
// metrics, so raw keys never leave the database.
func KeyHash(merchantID uuid.UUID, key string) string {
	h := sha256.New()
	h.Write(merchantID[:])
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:8])
}
