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
//  1. planAheadSQL: planSQL's settings, and a lock_timeout that ends any
//     wait for a row or key another transaction holds;
//  2. writeAheadSQL: the batch's writes and the check of every premise it
//     was decided on, in one statement, or a refusal.

const (
	planAheadSQL = planSQL + `,
       set_config('lock_timeout', '` + aheadLockTimeout + `', true)`

	// aheadLockTimeout bounds how long a batch decided ahead waits for an
	// account row or a key another transaction holds before it is refused
	// and runs the usual way, which waits for no lock. An UPDATE cannot skip
	// a locked row as SELECT ... SKIP LOCKED does, and locking each row
	// before updating it would cost a second write of it; a holder that is
	// charging the account changes its balance anyway, so a longer wait
	// would mostly end in a refusal too.
	aheadLockTimeout = "1ms"

	// codeNotAsExpected is payments_charge_batch_refused's error.
	codeNotAsExpected = "PA001"
)

// CommitAhead runs a batch decided ahead; see chargedb.Store.
func (s *ChargeDB) CommitAhead(ctx context.Context, reqs []chargedb.KeyedCharge, e chargedb.Expected, w *chargedb.Writes) (time.Time, error) {
	if len(w.Keys) == 0 || len(w.Expired) > 0 || w.ConfirmReplays {
		return time.Time{}, fmt.Errorf("a batch decided ahead stores a response for each member, and replays or deletes none")
	}
	args, err := aheadArgs(e, w)
	if err != nil {
		return time.Time{}, err
	}

	conn, err := s.acquire(ctx)
	if err != nil {
		return time.Time{}, chargeErr(err)
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue(planAheadSQL)
	b.Queue(s.chargeSQL.writeAhead, args)
	var storedAt time.Time
	err = s.durably(ctx, conn.Conn().PgConn(), func(commitCtx context.Context) (err error) {
		storedAt, err = readAhead(conn.SendBatch(commitCtx, b))
		switch {
		case isRefusal(err):
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

// aheadArgs gives the columns writeAheadSQL reads: w's charge rows
// (chargeRowArgs), the batch's clock, and a debit for every account in e,
// in e's order, with the currency and balance it was decided against.
func aheadArgs(e chargedb.Expected, w *chargedb.Writes) (pgx.NamedArgs, error) {
	args, err := chargeRowArgs(w)
	if err != nil {
		return nil, err
	}
	debits := make(map[chargedb.AccountKey]chargedb.Debit, len(w.Debits))
	for _, d := range w.Debits {
		debits[d.Account] = d
	}
	n := len(e.Accounts)
	merchants, ids, amounts, holds := make([]pgtype.UUID, n), make([]pgtype.UUID, n), make([]int64, n), make([]int64, n)
	currencies, balances := make([]string, n), make([]int64, n)
	for i, a := range e.Accounts {
		ak := chargedb.AccountKey{Merchant: a.MerchantID, ID: a.ID}
		d := debits[ak]
		delete(debits, ak)
		merchants[i], ids[i], amounts[i], holds[i] = pgUUID(a.MerchantID), pgUUID(a.ID), d.Amount, d.Hold
		currencies[i], balances[i] = a.Currency, a.Balance
	}
	if len(debits) > 0 {
		return nil, fmt.Errorf("a batch decided ahead debits %d accounts it was not decided against", len(debits))
	}
	args["debit_merchants"], args["debit_accounts"], args["debit_amounts"], args["debit_holds"] = merchants, ids, amounts, holds
	args["expected_currencies"], args["expected_balances"], args["batch_clock"] = currencies, balances, e.At
	return args, nil
}

// isRefusal reports whether err is writeAheadSQL's refusal: a premise
// checked false, a key stored already, or a wait for another transaction's
// lock cut short.
func isRefusal(err error) bool {
	return hasCode(err, codeNotAsExpected) || hasCode(err, codeLockNotAvailable) ||
		hasConstraint(err, codeUniqueViolation, "idempotency_keys_pkey")
}

// readAhead reads the answers of CommitAhead's round trip: the commit is
// its end (Close reads up to it).
func readAhead(br pgx.BatchResults) (storedAt time.Time, err error) {
	defer func() {
		if closeErr := br.Close(); err == nil {
			err = closeErr
		}
	}()
	if _, err := br.Exec(); err != nil { // planAheadSQL
		return time.Time{}, err
	}
	err = br.QueryRow().Scan(&storedAt)
	return storedAt, err
}
