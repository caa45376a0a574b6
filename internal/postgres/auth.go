package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
)

// authTrust is how long a key found valid is trusted without asking the
// database again: it bounds how late a revocation takes effect on a replica.
// authCacheMax bounds the cache's size.
const (
	authTrust    = time.Second
	authCacheMax = 10_000
)

var (
	errNotAnAPIKey = fmt.Errorf("%w: this is not an API key (%s followed by 43 base64url characters)",
		payment.ErrUnauthenticated, APIKeyPrefix)
	errUnknownAPIKey = fmt.Errorf("%w: unknown or revoked API key", payment.ErrUnauthenticated)
)

// merchantOfKeySQL finds a valid key's merchant, and whether its last use is
// due to be written (at most once a minute; keyuse.go writes it). It only
// reads: a lookup waits for no lock and no standby.
const merchantOfKeySQL = `
SELECT merchant_id, last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
FROM api_keys WHERE hash = $1 AND revoked_at IS NULL`

// Authenticate returns the merchant owning apiKey, or an error wrapping
// payment.ErrUnauthenticated (or payment.ErrUnavailable, or a
// *payment.RetryAfter of payment.ErrTooManyUnknownKeys). client identifies
// the caller (its address) for the budget of lookups (KeyBudget). A token
// that is no API key never reaches the database; a valid key is trusted for
// authTrust, an unknown or revoked one refused from memory for
// unknownForget; keys are looked up by their SHA-256 hash, so the time taken
// tells nothing about a guess.
func (s *Merchants) Authenticate(ctx context.Context, apiKey, client string) (uuid.UUID, error) {
	if !wellFormedAPIKey(apiKey) {
		return uuid.Nil, errNotAnAPIKey
	}
	hash := sha256.Sum256([]byte(apiKey))
	now := time.Now()
	merchant, trusted, known := s.auth.get(hash, now)
	if trusted {
		return merchant, nil
	}
	if !known && s.unknown.has(hash, now) {
		return uuid.Nil, errUnknownAPIKey // no lookup, no budget spent
	}
	// Concurrent requests with one key share one lookup.
	v, err, _ := s.authFlight.Do(string(hash[:]), func() (any, error) { return s.lookupAPIKey(ctx, hash, known, client) })
	if err != nil {
		return uuid.Nil, err
	}
	return v.(uuid.UUID), nil
}

// lookupAPIKey asks the database for the merchant of the key hashed to hash
// and remembers the answer. A key not known valid first waits for client's
// budget and a lookup slot (awaitLookup); if it turns out unknown, it spends
// a token of the budget.
func (s *Merchants) lookupAPIKey(ctx context.Context, hash [sha256.Size]byte, known bool, client string) (uuid.UUID, error) {
	// Shared by every request waiting on this lookup: no one client's cancel
	// may fail the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.LookupWait)
	defer cancel()
	if !known {
		release, err := s.awaitLookup(ctx, client)
		if err != nil {
			return uuid.Nil, err
		}
		defer release()
	}
	began := time.Now() // the answer is no older than this
	var (
		id  uuid.UUID
		due bool
	)
	err := s.pool.QueryRow(ctx, merchantOfKeySQL, hash[:]).Scan(&id, &due)
	if errors.Is(err, pgx.ErrNoRows) {
		s.auth.forget(hash)
		s.unknown.add(hash, time.Now())
		if !known {
			s.budget.charge(client, time.Now())
		}
		return uuid.Nil, errUnknownAPIKey
	}
	if err != nil {
		return uuid.Nil, asUnavailable(fmt.Errorf("look up API key: %w", err))
	}
	if due {
		s.keyUses.note(hash)
	}
	s.auth.put(hash, id, began.Add(authTrust))
	return id, nil
}

// authCache remembers the hashes of keys found valid and their merchants.
// An entry past its trust is still known: it is looked up again, without
// charging the client's failure budget.
type authCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]authEntry
}

type authEntry struct {
	merchant     uuid.UUID
	trustedUntil time.Time
}

func (c *authCache) get(hash [sha256.Size]byte, now time.Time) (merchant uuid.UUID, trusted, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[hash]
	if !ok {
		return uuid.Nil, false, false
	}
	return e.merchant, now.Before(e.trustedUntil), true
}

func (c *authCache) put(hash [sha256.Size]byte, merchant uuid.UUID, trustedUntil time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[hash]; !ok && (c.entries == nil || len(c.entries) >= authCacheMax) {
		c.entries = make(map[[sha256.Size]byte]authEntry) // start over rather than grow
	}
	c.entries[hash] = authEntry{merchant: merchant, trustedUntil: trustedUntil}
}

func (c *authCache) forget(hash [sha256.Size]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, hash)
}
