package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"payments/internal/idempotency"
)

// BatchAnswer is one member's answer to RunChargeBatch: its result, or that
// it left the batch because its key was in flight or its account busy.
type BatchAnswer struct {
	Result         idempotency.Result
	Err            error
	InFlight, Busy bool
}

// RunChargeBatch runs reqs as exactly one batch, as the group commit would
// after gathering them (split in halves if a member's statement fails). The
// members that leave it are only reported, not run: see RunChargeAlone.
func (s *Store) RunChargeBatch(ctx context.Context, reqs []idempotency.ChargeRequest) ([]BatchAnswer, error) {
	answers, err := s.chargeBatch(ctx, reqs, waits{})
	out := make([]BatchAnswer, len(answers))
	for i, a := range answers {
		out[i] = BatchAnswer{a.res, a.err, a.inFlight, a.busy}
	}
	return out, err
}

// RunChargeAlone runs req as a member that left its batch does: alone,
// waiting up to KeyWait for its key and its account.
func (s *Store) RunChargeAlone(ctx context.Context, req idempotency.ChargeRequest) (idempotency.Result, error) {
	return s.chargeAlone(ctx, req, time.Now().Add(s.opts.KeyWait))
}

// StallChargeBatches makes every charge batch wait for release before it
// runs, as a batcher that stopped making progress would.
func (s *Store) StallChargeBatches() (release func()) {
	stall := make(chan struct{})
	s.charges = s.newChargeBatcher(func(ctx context.Context, reqs []idempotency.ChargeRequest) ([]chargeAnswer, error) {
		<-stall
		return s.runBatch(ctx, reqs)
	})
	var once sync.Once
	return func() { once.Do(func() { close(stall) }) }
}

// WithoutKeys makes s run charge batches with the idempotency key taken out:
// no key locks, no lookup, no key rows; the same accounts, charges, events,
// round trips and commit. It exists only to price the key.
func (s *Store) WithoutKeys() error {
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
	if st.write, err = replace(writeChargesSQL, `INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, body_encoding, created_at)
    SELECT k.*, stored.at FROM unnest(`, `SELECT count(*) FROM unnest(`); err != nil {
		return err
	}
	s.chargeSQL = st
	return nil
}
