package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
)

// A charge batch decided ahead (internal/charging, ahead.go): one round trip
// in one implicit transaction, which commits when the round trip's last
// statement succeeds and rolls back whole when any fails. No BEGIN and no
// COMMIT: a refused batch leaves its connection as it found it, at no further
// round trip.
//
//  1. planSQL, as for every batch;
//  2. expectSQL (migration 0029): the keys' advisory locks and the accounts'
//     rows, taken without waiting, and the check that nothing the batch was
//     decided against has changed, or PA001;
//  3. writeChargesSQL, the same writes a locked batch makes.

const (
	expectSQL = `SELECT payments_charge_batch_expect($1::uuid[], $2::text[], $3::uuid[], $4::uuid[], $5::text[], $6::bigint[], $7::timestamptz)`

	// codeNotAsExpected is payments_charge_batch_expect's refusal.
	codeNotAsExpected = "PA001"
)

// CommitAhead runs a batch decided ahead; see chargedb.Store.
func (s *ChargeDB) CommitAhead(ctx context.Context, reqs []chargedb.KeyedCharge, e chargedb.Expected, w *chargedb.Writes) (time.Time, error) {
	if len(w.Keys) == 0 || len(w.Expired) > 0 || w.ConfirmReplays {
		return time.Time{}, fmt.Errorf("a batch decided ahead stores a response for each member, and replays or deletes none")
	}
	args, err := namedArgs(w)
	if err != nil {
		return time.Time{}, err
	}
	n, a := len(reqs), len(e.Accounts)
	merchants, keys := make([]pgtype.UUID, n), make([]string, n)
	for i, r := range reqs {
		merchants[i], keys[i] = pgUUID(r.Request.MerchantID), r.Request.Key
	}
	accountMerchants, accountIDs, currencies, balances := make([]pgtype.UUID, a), make([]pgtype.UUID, a), make([]string, a), make([]int64, a)
	for i, acct := range e.Accounts {
		accountMerchants[i], accountIDs[i], currencies[i], balances[i] = pgUUID(acct.MerchantID), pgUUID(acct.ID), acct.Currency, acct.Balance
	}

	conn, err := s.acquire(ctx)
	if err != nil {
		return time.Time{}, chargeErr(err)
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue(planSQL)
	b.Queue(s.chargeSQL.expect, merchants, keys, accountMerchants, accountIDs, currencies, balances, e.At)
	b.Queue(s.chargeSQL.write, args)
	var storedAt time.Time
	err = s.durably(ctx, conn.Conn().PgConn(), func(commitCtx context.Context) (err error) {
		storedAt, err = readAhead(conn.SendBatch(commitCtx, b))
		switch {
		case hasCode(err, codeNotAsExpected):
			return fmt.Errorf("%w: %w", chargedb.ErrNotAsExpected, err)
		case err != nil:
			return chargeErr(fmt.Errorf("write charges decided ahead: %w", err))
		}
		return nil
	})
	s.transactionEnded()
	if err != nil {
		return time.Time{}, err
	}
	if len(w.Charges) > 0 {
		s.eventsCommitted()
	}
	return storedAt, nil
}

// readAhead reads the answers of CommitAhead's round trip: the commit is
// its end (Close reads up to it).
func readAhead(br pgx.BatchResults) (storedAt time.Time, err error) {
	defer func() {
		if closeErr := br.Close(); err == nil {
			err = closeErr
		}
	}()
	for range 2 { // planSQL, expectSQL
		if _, err := br.Exec(); err != nil {
			return time.Time{}, err
		}
	}
	err = br.QueryRow().Scan(&storedAt)
	return storedAt, err
}
