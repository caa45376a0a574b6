package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
)

// WithoutKeys makes s run charge batches with the idempotency key taken out:
// no key locks, no lookup, no key rows; the same accounts, charges, events,
// round trips and commit. It exists only to price the key.
func (s *ChargeDB) WithoutKeys() error {
	replace := func(sql, old, new string) (string, error) {
		out := strings.Replace(sql, old, new, 1)
		if out == sql {
			return "", fmt.Errorf("WithoutKeys: %q is no longer in the statement; update it", old)
		}
		return out, nil
	}
	var st chargeStatements
	var err error
	if st.tryLockKeys, err = replace(tryLockKeysSQL, "pg_try_advisory_xact_lock(hashtextextended(m::text || k, 0))", "true"); err != nil {
		return err
	}
	if st.lookupKeys, err = replace(lookupKeysSQL, `LEFT JOIN idempotency_keys ik ON ik.merchant_id = u.m AND ik.key = u.k`,
		`LEFT JOIN idempotency_keys ik ON false`); err != nil {
		return err
	}
	if st.lockAccounts, err = replace(lockAccountsSQL, `WHERE u.locked AND NOT EXISTS (`, `WHERE $4::interval IS NOT NULL OR NOT EXISTS (`); err != nil {
		return err
	}
	// Both writing statements store the keys' rows in chargeRowsSQL.
	const storeKeys, countKeys = `INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, body_encoding, created_at)
    SELECT k.*, stored.at FROM unnest(`, `SELECT count(*) FROM unnest(`
	if st.write, err = replace(writeChargesSQL, storeKeys, countKeys); err != nil {
		return err
	}
	// A batch decided ahead locks no key and stores none.
	if st.writeAhead, err = replace(writeAheadSQL, `pg_try_advisory_xact_lock(hashtextextended(u.m::text || u.k, 0))`, "true"); err != nil {
		return err
	}
	if st.writeAhead, err = replace(st.writeAhead, storeKeys, countKeys); err != nil {
		return err
	}
	s.chargeSQL = st
	return nil
}

// Pipelined runs stmts in one round trip with their transaction
// (pipelined.go), each read by Exec.
func (s *DB) Pipelined(ctx context.Context, stmts ...string) error {
	qs := make([]*pgx.QueuedQuery, len(stmts))
	for i, sql := range stmts {
		qs[i] = &pgx.QueuedQuery{SQL: sql}
	}
	return s.pipelined(ctx, qs, func(br pgx.BatchResults) error {
		for range stmts {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return nil
	})
}

// TakeReadSlots takes n of the read slots (acquireRead) as n reads holding
// their connections would, until release.
func (s *DB) TakeReadSlots(n int) (release func()) {
	for range n {
		s.readSlots <- struct{}{}
	}
	return func() {
		for range n {
			<-s.readSlots
		}
	}
}

// ReadSlots is how many reads may hold a pooled connection at once.
func (s *DB) ReadSlots() int { return cap(s.readSlots) }

// WriteAheadSQL is the statement that writes a batch decided ahead and checks
// its premises.
const WriteAheadSQL = writeAheadSQL

// EmptyAheadArgs is WriteAheadSQL's arguments for a batch of no member
// decided at clock.
func EmptyAheadArgs(clock time.Time) (pgx.NamedArgs, error) {
	return aheadArgs(chargedb.Expected{At: clock}, &chargedb.Writes{})
}
