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

// The failure budget: each client address may look up UnknownKeyBurst keys
// that turn out unknown, then UnknownKeyRate a second; past it, keys this
// process has not seen valid are refused without a lookup. Only failures
// spend it, so a burst of valid keys (a restart behind a proxy) is never
// refused; at most UnknownKeyLookups such lookups run at once, which bounds
// how far concurrent failures overshoot the budget.
const (
	UnknownKeyBurst   = 10
	UnknownKeyRate    = 1.0
	UnknownKeyLookups = 4
	budgetMaxClients  = 10_000
)

var (
	errNotAnAPIKey = fmt.Errorf("%w: this is not an API key (%s followed by 43 base64url characters)",
		payment.ErrUnauthenticated, APIKeyPrefix)
	errUnknownAPIKey  = fmt.Errorf("%w: unknown or revoked API key", payment.ErrUnauthenticated)
	errTooManyUnknown = fmt.Errorf("%w: too many unknown API keys from this address; try again later",
		payment.ErrUnauthenticated)
)

// merchantOfKeySQL finds a valid key's merchant and, at most once a minute,
// records that the key was used.
const merchantOfKeySQL = `
WITH used AS (
	UPDATE api_keys SET last_used_at = now()
	WHERE hash = $1 AND revoked_at IS NULL
	  AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')
)
SELECT merchant_id FROM api_keys WHERE hash = $1 AND revoked_at IS NULL`

// Authenticate returns the merchant owning apiKey, or an error wrapping
// payment.ErrUnauthenticated (or payment.ErrUnavailable). client identifies the
// caller (its address) for the failure budget. A token that is no API key never
// reaches the database; a valid key is trusted for authTrust; keys are looked
// up by their SHA-256 hash, so the time taken tells nothing about a guess.
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
	if !known && !s.unknownKeys.allows(client, now) {
		return uuid.Nil, errTooManyUnknown
	}
	// Concurrent requests with one key share one lookup.
	v, err, _ := s.authFlight.Do(string(hash[:]), func() (any, error) { return s.lookupAPIKey(ctx, hash, known, client) })
	if errors.Is(err, errUnknownAPIKey) {
		s.unknownKeys.charge(client, time.Now())
	}
	if err != nil {
		return uuid.Nil, err
	}
	return v.(uuid.UUID), nil
}

// lookupAPIKey asks the database for the merchant of the key hashed to hash
// and caches the answer. A key not known valid waits for one of the
// UnknownKeyLookups slots, then checks client's budget again.
func (s *Merchants) lookupAPIKey(ctx context.Context, hash [sha256.Size]byte, known bool, client string) (uuid.UUID, error) {
	// Shared by every request waiting on this lookup: no one client's cancel
	// may fail the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.KeyWait)
	defer cancel()
	if !known {
		select {
		case s.unknownSlots <- struct{}{}:
			defer func() { <-s.unknownSlots }()
		case <-ctx.Done():
			return uuid.Nil, fmt.Errorf("%w: wait to look up an API key: %w", payment.ErrUnavailable, ctx.Err())
		}
		if !s.unknownKeys.allows(client, time.Now()) {
			return uuid.Nil, errTooManyUnknown
		}
	}
	began := time.Now() // the answer is no older than this
	var id uuid.UUID
	err := s.pool.QueryRow(ctx, merchantOfKeySQL, hash[:]).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		s.auth.forget(hash)
		return uuid.Nil, errUnknownAPIKey
	}
	if err != nil {
		return uuid.Nil, asUnavailable(fmt.Errorf("look up API key: %w", err))
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

// failureBudget is a token bucket per client address.
type failureBudget struct {
	mu      sync.Mutex
	buckets map[string]bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// allows reports whether client has a token left.
func (b *failureBudget) allows(client string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.buckets[client]
	return !ok || k.refilled(now) >= 1
}

// charge takes a token from client's bucket for a lookup that failed.
func (b *failureBudget) charge(client string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.buckets[client]
	if !ok {
		b.makeRoom(now)
		k = bucket{tokens: UnknownKeyBurst, at: now}
	}
	b.buckets[client] = bucket{tokens: max(0, k.refilled(now)-1), at: now}
}

func (k bucket) refilled(now time.Time) float64 {
	return min(UnknownKeyBurst, k.tokens+now.Sub(k.at).Seconds()*UnknownKeyRate)
}

// makeRoom keeps the map within budgetMaxClients: full buckets say nothing
// and go first; if that is not enough, it starts over.
func (b *failureBudget) makeRoom(now time.Time) {
	if b.buckets == nil {
		b.buckets = make(map[string]bucket)
	}
	if len(b.buckets) < budgetMaxClients {
		return
	}
	for c, k := range b.buckets {
		if k.refilled(now) >= UnknownKeyBurst {
			delete(b.buckets, c)
		}
	}
	if len(b.buckets) >= budgetMaxClients {
		b.buckets = make(map[string]bucket)
	}
}
