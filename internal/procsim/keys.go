package procsim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// answer is one response as the simulator stores and replays it.
type answer struct {
	status int
	body   []byte
	psps   []string // the payments it names, marked answered once delivered
}

// errKeyReused is a known key sent with another request.
var errKeyReused = errors.New("idempotency key reused with another request")

// fingerprint identifies a request under a key: its method, path and exact body.
func fingerprint(method, path string, body []byte) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", method, path)
	h.Write(body)
	return h.Sum(nil)
}

// claimKey inserts key in tx. A key some other transaction holds makes the
// insert wait for it; if that one committed, claimKey returns its stored
// answer (replayed) or errKeyReused, and claimed is false.
func claimKey(ctx context.Context, tx pgx.Tx, key string, fp []byte, now time.Time) (stored answer, claimed bool, err error) {
	tag, err := tx.Exec(ctx, `INSERT INTO procsim_keys (key, fingerprint, status, body, psp_references, created_at)
		VALUES ($1, $2, 0, '', '{}', $3) ON CONFLICT (key) DO NOTHING`, key, fp, now)
	if err != nil {
		return answer{}, false, fmt.Errorf("claim key: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return answer{}, true, nil
	}
	var storedFP []byte
	err = tx.QueryRow(ctx, `SELECT fingerprint, status, body, psp_references FROM procsim_keys WHERE key = $1`, key).
		Scan(&storedFP, &stored.status, &stored.body, &stored.psps)
	if err != nil {
		return answer{}, false, fmt.Errorf("read key: %w", err)
	}
	if !bytes.Equal(storedFP, fp) {
		return answer{}, false, errKeyReused
	}
	return stored, false, nil
}

// storeKey writes the answer of a claimed key.
func storeKey(ctx context.Context, tx pgx.Tx, key string, a answer) error {
	psps := a.psps
	if psps == nil {
		psps = []string{}
	}
	_, err := tx.Exec(ctx, `UPDATE procsim_keys SET status = $2, body = $3, psp_references = $4 WHERE key = $1`,
		key, a.status, a.body, psps)
	if err != nil {
		return fmt.Errorf("store key: %w", err)
	}
	return nil
}

// releaseKey forgets a claimed key whose answer is not to be kept (a refused
// reversal), so a retry with it executes again.
func releaseKey(ctx context.Context, tx pgx.Tx, key string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM procsim_keys WHERE key = $1`, key); err != nil {
		return fmt.Errorf("release key: %w", err)
	}
	return nil
}
