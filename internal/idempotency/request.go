package idempotency

import (
	"errors"
	"time"

	"github.com/google/uuid"
)

// Request is what a retried request is recognised by: the merchant's key and the
// fingerprint of what it asks for.
type Request struct {
	MerchantID  uuid.UUID
	Key         string
	Fingerprint Fingerprint
}

// Response is the outcome stored under a key and replayed for its retries,
// byte for byte.
type Response struct {
	Status   int
	Location string // empty when the response has none
	Body     []byte
}

// Result is the answer to a request: the response, and whether it is a replay
// of an earlier execution rather than this request's own.
type Result struct {
	Response
	Replayed bool
	// StoredAt is when the response was stored under the key, by the
	// database's clock; the key expires StoredAt plus the retention.
	StoredAt time.Time
	// Operation, when set, is the operation the key is bound to, still
	// going on: there is no response yet (Status is 0), and the caller
	// answers from the operation (see Keys.Idempotent).
	Operation uuid.UUID
}

// Errors of a request whose key is already known.
var (
	// ErrKeyReused: the key was used for a different request (method, path or
	// body differ). Nothing executes.
	ErrKeyReused = errors.New("this Idempotency-Key was already used for a different request")

	// ErrKeyInUse: a request with this key is still being processed and did not
	// finish within the wait bound. Nothing executes; retry later.
	ErrKeyInUse = errors.New("a request with this Idempotency-Key is still being processed")
)

// Replay decides the answer to req from the record stored under its key: the
// stored response, marked as a replay, or ErrKeyReused when req is a different
// request.
func Replay(req Request, stored Fingerprint, resp Response) (Result, error) {
	if stored != req.Fingerprint {
		return Result{}, ErrKeyReused
	}
	return Result{Response: resp, Replayed: true}, nil
}
