package postgres

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

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
// The key is looked up by its SHA-256 hash, so the comparison never touches the
// secret itself and takes the same time whichever key is presented.
func (s *Store) Authenticate(ctx context.Context, apiKey string) (uuid.UUID, error) {
	hash := sha256.Sum256([]byte(apiKey))
	var id uuid.UUID
	err := s.pool.QueryRow(ctx, `SELECT merchant_id FROM api_keys WHERE hash = $1`, hash[:]).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, payment.ErrUnauthenticated
	}
	if err != nil {
		return uuid.Nil, interpret(fmt.Errorf("look up API key: %w", err))
	}
	return id, nil
}
