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
	"net/http"

	"github.com/google/uuid"
)

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// MaxKeyLength is the longest key accepted, in bytes.
const MaxKeyLength = 255

// Errors from ParseKey.
var (
	ErrKeyMissing = errors.New("the Idempotency-Key header is required on this request")
	ErrKeyInvalid = errors.New("the Idempotency-Key header must be 1 to 255 visible ASCII characters (0x21-0x7E), sent once")
)

// ParseKey returns the request's idempotency key. It returns ErrKeyMissing when
// the header is absent and ErrKeyInvalid when it is empty, repeated, too long, or
// contains anything but visible ASCII.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(Header)
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", ErrKeyInvalid
	}
	key := values[0]
	if !ValidKey(key) {
		return "", ErrKeyInvalid
	}
	return key, nil
}

// ValidKey reports whether key is 1 to MaxKeyLength visible ASCII characters.
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// KeyHash returns a short, stable digest of a merchant's key for logs and
// metrics, so raw keys never leave the database.
func KeyHash(merchantID uuid.UUID, key string) string {
	h := sha256.New()
	h.Write(merchantID[:])
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:8])
}
