package idempotency

import (
	"crypto/sha256"
)

// Fingerprint identifies a request for the purpose of its idempotency key: the
// SHA-256 of method, path and canonical JSON body.
type Fingerprint [sha256.Size]byte

// NewFingerprint fingerprints a request whose body is already canonical (see
// Canonicalize).
func NewFingerprint(method, path string, canonicalBody []byte) Fingerprint {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canonicalBody)
	var f Fingerprint
	h.Sum(f[:0])
	return f
}
