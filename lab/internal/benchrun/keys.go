package benchrun

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// HeldKey is a key held in flight the way another replica of the service
// holds it: a session that took the key's advisory lock and inserted its
// row (no response yet), and stays in its transaction until Release.
type HeldKey struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

// HoldKey holds key of merchant on database; it returns once the key is
// held.
func HoldKey(ctx context.Context, database, merchant, key string) (*HeldKey, error) {
	conn, err := pgx.Connect(ctx, database)
	if err != nil {
		return nil, err
	}
	h := &HeldKey{conn: conn}
	if h.tx, err = conn.Begin(ctx); err == nil {
		_, err = h.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || $2, 0))`, merchant, key)
	}
	if err == nil {
		_, err = h.tx.Exec(ctx, `INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ($1, $2, '\x00')`, merchant, key)
	}
	if err != nil {
		h.Release(ctx)
		return nil, fmt.Errorf("could not hold the key: %w", err)
	}
	return h, nil
}

// Release ends the session; its transaction rolls back.
func (h *HeldKey) Release(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if h.tx != nil {
		_ = h.tx.Rollback(ctx)
	}
	_ = h.conn.Close(ctx)
}

// SeedKeys inserts keys from..to of merchant in one statement, as the
// service stores a completed charge: a UUID-shaped key (random order in
// the primary key, as clients' keys are), a 32-byte fingerprint, status
// 201, a Location and a ~280-byte JSON body like a real charge response.
// tag makes the keys of different calls distinct; createdAt is an SQL
// expression in i (the series number).
func SeedKeys(ctx context.Context, database, merchant, tag string, from, to int, createdAt string) error {
	return withConn(ctx, database, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, created_at)
SELECT $1::uuid, k, sha256(convert_to(k, 'UTF8')), 201, '/v1/charges/ch_' || h,
       convert_to('{"id":"ch_' || h || '","object":"charge","account_id":"acct_' || md5(k || 'a')
           || '","amount":100,"currency":"USD","status":"succeeded","failure_code":null,'
           || '"amount_refunded":0,"description":null,"metadata":{},"created_at":"'
           || to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '"}', 'UTF8'),
       t
FROM generate_series($2::int, $3::int) i,
     LATERAL (SELECT md5('seed-' || $4::text || '-' || i)::uuid::text AS k,
                     md5('ch-' || $4::text || '-' || i) AS h, `+createdAt+` AS t) s`,
			merchant, from, to, tag)
		return err
	})
}

// AfterSeeding does what a deployed database would have done by itself
// (autovacuum's ANALYZE, a checkpoint), so that it does not land in a
// measured window instead.
func AfterSeeding(ctx context.Context, database string) error {
	return Exec(ctx, database, "VACUUM (ANALYZE) idempotency_keys", "CHECKPOINT")
}
