package payment

import (
	"encoding/hex"
	"strings"

	"github.com/google/uuid"
)

// Public ids are a type prefix followed by the 32 lowercase hex digits of a UUID.
const (
	PrefixAccount = "acct_"
	PrefixDeposit = "dep_"
	PrefixCharge  = "ch_"
	PrefixRefund  = "re_"
	PrefixEvent   = "evt_"
)

// NewID returns a new time-ordered (version 7) UUID, which keeps index inserts
// local. It panics only if the system's random source fails.
func NewID() uuid.UUID {
	return uuid.Must(uuid.NewV7())
}

// FormatID renders id with its type prefix, e.g. "ch_0193…".
func FormatID(prefix string, id uuid.UUID) string {
	var b [32]byte
	hex.Encode(b[:], id[:])
	return prefix + string(b[:])
}

// ParseID parses an id rendered by FormatID with the same prefix. It reports
// false for anything else, so a malformed id reads as an unknown one.
func ParseID(prefix, s string) (uuid.UUID, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || len(rest) != 32 || strings.ToLower(rest) != rest {
		return uuid.Nil, false
	}
	var id uuid.UUID
	if _, err := hex.Decode(id[:], []byte(rest)); err != nil {
		return uuid.Nil, false
	}
	return id, true
}
