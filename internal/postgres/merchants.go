package postgres

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactlyonce/payments/internal/payment"
)

// APIKeyPrefix starts every API key, so leaked keys are easy to recognise.
const APIKeyPrefix = "sk_"

// KeyIDPrefix starts every API key's public id.
const KeyIDPrefix = "key_"

// An API key is APIKeyPrefix and apiKeySecretBytes random bytes in unpadded
// base64url: apiKeyLen characters.
const (
	apiKeySecretBytes = 32
	apiKeyLen         = len(APIKeyPrefix) + (apiKeySecretBytes*8+5)/6
)

// Errors of the API key commands.
var (
	ErrUnknownMerchant = errors.New("unknown merchant")
	ErrUnknownAPIKey   = errors.New("unknown API key")
	ErrAPIKeyRevoked   = errors.New("API key already revoked")
)

// NewAPIKey is a key just created: its public id and the secret, which is
// shown only once (the database keeps its SHA-256 hash).
type NewAPIKey struct {
	ID     string
	Secret string
}

// APIKey describes a merchant's key without its secret.
type APIKey struct {
	ID         string
	CreatedAt  time.Time
	LastUsedAt *time.Time // within a minute; nil if never used
	RevokedAt  *time.Time // nil while valid
}

// RegisterMerchant registers a merchant with one API key and returns both.
func (s *Merchants) RegisterMerchant(ctx context.Context, name string) (uuid.UUID, NewAPIKey, error) {
	id := payment.NewID()
	var key NewAPIKey
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO merchants (id, name) VALUES ($1, $2)`, id, name); err != nil {
			return fmt.Errorf("insert merchant: %w", err)
		}
		var err error
		key, err = insertAPIKey(ctx, tx, id)
		return err
	})
	if err != nil {
		return uuid.Nil, NewAPIKey{}, asUnavailable(err)
	}
	return id, key, nil
}

// CreateAPIKey gives merchant one more API key. It returns ErrUnknownMerchant
// when there is no such merchant.
func (s *Merchants) CreateAPIKey(ctx context.Context, merchant uuid.UUID) (NewAPIKey, error) {
	var key NewAPIKey
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		key, err = insertAPIKey(ctx, tx, merchant)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeForeignKeyViolation {
		return NewAPIKey{}, fmt.Errorf("%w %s", ErrUnknownMerchant, merchant)
	}
	if err != nil {
		return NewAPIKey{}, asUnavailable(err)
	}
	return key, nil
}

func insertAPIKey(ctx context.Context, tx pgx.Tx, merchant uuid.UUID) (NewAPIKey, error) {
	secret := make([]byte, apiKeySecretBytes)
	id := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return NewAPIKey{}, fmt.Errorf("generate API key: %w", err)
	}
	if _, err := rand.Read(id); err != nil {
		return NewAPIKey{}, fmt.Errorf("generate API key id: %w", err)
	}
	key := NewAPIKey{ID: KeyIDPrefix + hex.EncodeToString(id), Secret: APIKeyPrefix + base64.RawURLEncoding.EncodeToString(secret)}
	hash := sha256.Sum256([]byte(key.Secret))
	if _, err := tx.Exec(ctx, `INSERT INTO api_keys (hash, id, merchant_id) VALUES ($1, $2, $3)`, hash[:], key.ID, merchant); err != nil {
		return NewAPIKey{}, fmt.Errorf("insert API key: %w", err)
	}
	return key, nil
}

// ListAPIKeys returns merchant's keys, oldest first, revoked ones included. It
// returns ErrUnknownMerchant when there is no such merchant.
func (s *Merchants) ListAPIKeys(ctx context.Context, merchant uuid.UUID) ([]APIKey, error) {
	var keys []APIKey
	err := s.read(ctx, func(tx querier) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM merchants WHERE id = $1)`, merchant).Scan(&exists); err != nil {
			return fmt.Errorf("look up merchant: %w", err)
		}
		if !exists {
			return fmt.Errorf("%w %s", ErrUnknownMerchant, merchant)
		}
		rows, err := tx.Query(ctx, `SELECT id, created_at, last_used_at, revoked_at FROM api_keys
			WHERE merchant_id = $1 ORDER BY created_at, id`, merchant)
		if err != nil {
			return fmt.Errorf("list API keys: %w", err)
		}
		keys, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (APIKey, error) {
			var k APIKey
			err := row.Scan(&k.ID, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
			return k, err
		})
		return err
	})
	return keys, asUnavailable(err)
}

// Merchant is a merchant as an operator lists it, with how many of its API
// keys are active (not revoked).
type Merchant struct {
	ID            uuid.UUID
	Name          string
	CreatedAt     time.Time
	ActiveAPIKeys int
}

// MerchantQuery selects a page of merchants, oldest first.
type MerchantQuery struct {
	Limit         int        // at most this many merchants
	StartingAfter *uuid.UUID // the page starts after this merchant; nil: from the oldest
}

const (
	merchantCreatedSQL = `SELECT created_at FROM merchants WHERE id = $1`

	// listMerchantsSQL reads a page of merchants in (created_at, id) order,
	// after the cursor's ($1, $2; from the first when $1 is null), and counts
	// the keys that are not revoked of the page's merchants only.
	listMerchantsSQL = `
SELECT m.id, m.name, m.created_at,
       (SELECT count(*) FROM api_keys k WHERE k.merchant_id = m.id AND k.revoked_at IS NULL)
FROM merchants m
WHERE $1::timestamptz IS NULL OR (m.created_at, m.id) > ($1::timestamptz, $2::uuid)
ORDER BY m.created_at, m.id
LIMIT $3`
)

// ListMerchants returns a page of merchants, oldest first, those created at
// the same moment in id order: one order, so that paging with StartingAfter
// repeats none and skips none that existed when the first page was read. It
// returns ErrUnknownMerchant when StartingAfter names no merchant.
func (s *Merchants) ListMerchants(ctx context.Context, q MerchantQuery) (p payment.Page[Merchant], err error) {
	err = s.read(ctx, func(db querier) error {
		var after *time.Time
		cursor := uuid.Nil
		if q.StartingAfter != nil {
			cursor, after = *q.StartingAfter, new(time.Time)
			err := db.QueryRow(ctx, merchantCreatedSQL, cursor).Scan(after)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w %s", ErrUnknownMerchant, cursor)
			}
			if err != nil {
				return asUnavailable(fmt.Errorf("look up merchant: %w", err))
			}
		}
		rows, err := db.Query(ctx, listMerchantsSQL, after, cursor, q.Limit+1)
		if err != nil {
			return asUnavailable(fmt.Errorf("list merchants: %w", err))
		}
		merchants, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Merchant, error) {
			var m Merchant
			err := row.Scan(&m.ID, &m.Name, &m.CreatedAt, &m.ActiveAPIKeys)
			return m, err
		})
		if err != nil {
			return asUnavailable(fmt.Errorf("list merchants: %w", err))
		}
		p = page(merchants, q.Limit)
		return nil
	})
	return p, err
}

// RevokeAPIKey revokes the key with the public id keyID: every replica refuses
// it within authTrust. It returns ErrUnknownAPIKey or ErrAPIKeyRevoked. Either
// answer, a revocation or "already revoked", is given only once the
// synchronous standby has it (or payment.ErrUnavailable).
func (s *Merchants) RevokeAPIKey(ctx context.Context, keyID string) (APIKey, error) {
	var k APIKey
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id, created_at, last_used_at, revoked_at FROM api_keys WHERE id = $1 FOR UPDATE`, keyID).
			Scan(&k.ID, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w %s", ErrUnknownAPIKey, keyID)
		}
		if err != nil {
			return fmt.Errorf("look up API key: %w", err)
		}
		if k.RevokedAt != nil {
			return fmt.Errorf("%w: %s was revoked at %s", ErrAPIKeyRevoked, keyID, k.RevokedAt.UTC().Format(time.RFC3339))
		}
		return tx.QueryRow(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1 RETURNING revoked_at`, keyID).Scan(&k.RevokedAt)
	})
	if errors.Is(err, ErrAPIKeyRevoked) {
		// Read, not written: "already revoked" only once the standby has
		// the revocation, which may be a commit whose wait was cancelled.
		if cerr := s.confirmCommitted(ctx); cerr != nil {
			return APIKey{}, cerr
		}
	}
	if err != nil {
		return APIKey{}, asUnavailable(err)
	}
	return k, nil
}

// wellFormedAPIKey reports whether apiKey could have been made by insertAPIKey;
// anything else is refused without asking the database.
func wellFormedAPIKey(apiKey string) bool {
	if len(apiKey) != apiKeyLen || !strings.HasPrefix(apiKey, APIKeyPrefix) {
		return false
	}
	secret, err := base64.RawURLEncoding.Strict().DecodeString(apiKey[len(APIKeyPrefix):])
	return err == nil && len(secret) == apiKeySecretBytes
}
