package postgres

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"payments/internal/payment"
)

// APIKeyPrefix starts every API key, so leaked keys are easy to recognise.
const APIKeyPrefix = "sk_"

// CreateMerchant registers a merchant with one API key and returns both. The key
// is returned only here: the database keeps its SHA-256 hash.
func (s *Store) CreateMerchant(ctx context.Context, name string) (uuid.UUID, string, error) {
	id := payment.NewID()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return uuid.Nil, "", fmt.Errorf("generate API key: %w", err)
	}
	apiKey := APIKeyPrefix + base64.RawURLEncoding.EncodeToString(secret)
	hash := sha256.Sum256([]byte(apiKey))
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO merchants (id, name) VALUES ($1, $2)`, id, name); err != nil {
			return fmt.Errorf("insert merchant: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO api_keys (hash, merchant_id) VALUES ($1, $2)`, hash[:], id); err != nil {
			return fmt.Errorf("insert API key: %w", err)
		}
		return nil
	})
	if err != nil {
		return uuid.Nil, "", interpret(err)
	}
	return id, apiKey, nil
}

// Authenticate returns the merchant owning apiKey, or payment.ErrUnauthenticated.
// Keys are looked up by their SHA-256 hash, never compared as secrets, so the
// time taken tells nothing about how much of a guess was right. Known keys are
// remembered for authCacheTTL to spare the hot path a round trip.
func (s *Store) Authenticate(ctx context.Context, apiKey string) (uuid.UUID, error) {
	hash := sha256.Sum256([]byte(apiKey))
	if id, ok := s.auth.get(hash); ok {
		return id, nil
	}
	var id uuid.UUID
	err := s.pool.QueryRow(ctx, `SELECT merchant_id FROM api_keys WHERE hash = $1`, hash[:]).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, payment.ErrUnauthenticated
	}
	if err != nil {
		return uuid.Nil, interpret(fmt.Errorf("look up API key: %w", err))
	}
	s.auth.put(hash, id)
	return id, nil
}

// authCacheTTL bounds how long a known API key is trusted without asking the
// database; authCacheMax bounds the cache's size.
const (
	authCacheTTL = 30 * time.Second
	authCacheMax = 10_000
)

// authCache remembers recently seen API key hashes and their merchants.
type authCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]authEntry
}

type authEntry struct {
	merchant uuid.UUID
	expires  time.Time
}

func (c *authCache) get(hash [sha256.Size]byte) (uuid.UUID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[hash]
	if !ok || time.Now().After(e.expires) {
		return uuid.Nil, false
	}
	return e.merchant, true
}

func (c *authCache) put(hash [sha256.Size]byte, merchant uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= authCacheMax {
		c.entries = make(map[[sha256.Size]byte]authEntry) // start over rather than grow
	}
	c.entries[hash] = authEntry{merchant: merchant, expires: time.Now().Add(authCacheTTL)}
}
