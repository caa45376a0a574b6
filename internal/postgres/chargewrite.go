package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
)

// A charge batch's second round trip: what the use case decided
// (chargedb.Writes), written by writeChargesSQL, and COMMIT.

// writeBatch runs a batch's second round trip on conn: w's writes and COMMIT,
// on no request's context and confirmed by the synchronous standby, if any
// (durable.go). It returns when the keys' responses were stored, if any were.
func (s *ChargeDB) writeBatch(ctx context.Context, conn *pgxpool.Conn, w *chargedb.Writes) (time.Time, error) {
	b := &pgx.Batch{}
	if len(w.Expired) > 0 {
		merchants, keys := make([]pgtype.UUID, len(w.Expired)), make([]string, len(w.Expired))
		for i, k := range w.Expired {
			merchants[i], keys[i] = pgUUID(k.MerchantID), k.Key
		}
		b.Queue(deleteExpiredKeysOfSQL, merchants, keys, s.opts.KeyTTL)
	}
	if len(w.Keys) > 0 {
		args, err := namedArgs(w)
		if err != nil {
			return time.Time{}, err
		}
		b.Queue(s.chargeSQL.write, args)
	}
	if w.ConfirmReplays {
		b.Queue(confirmSQL)
	}
	b.Queue("COMMIT")
	var storedAt time.Time
	err := s.durably(ctx, conn.Conn().PgConn(), func(commitCtx context.Context) (err error) {
		if storedAt, err = readWrites(conn.SendBatch(commitCtx, b), w); err != nil {
			return fmt.Errorf("write charges: %w", err)
		}
		return nil
	})
	return storedAt, err
}

// readWrites reads the answers of writeBatch's round trip.
func readWrites(br pgx.BatchResults, w *chargedb.Writes) (storedAt time.Time, err error) {
	defer func() {
		if closeErr := br.Close(); err == nil {
			err = closeErr
		}
	}()
	if len(w.Expired) > 0 {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, err
		}
	}
	if len(w.Keys) > 0 {
		if err := br.QueryRow().Scan(&storedAt); err != nil {
			return time.Time{}, err
		}
	}
	if w.ConfirmReplays {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, err
		}
	}
	_, err = br.Exec()
	return storedAt, err
}

// namedArgs gives w's writes as the columns writeChargesSQL reads, with the
// stored responses' bodies encoded (encodeBody).
func namedArgs(w *chargedb.Writes) (pgx.NamedArgs, error) {
	args, err := chargeRowArgs(w)
	if err != nil {
		return nil, err
	}
	d := len(w.Debits)
	debitMerchants, debitAccounts, debitAmounts, debitHolds := make([]pgtype.UUID, d), make([]pgtype.UUID, d), make([]int64, d), make([]int64, d)
	for i, d := range w.Debits {
		debitMerchants[i], debitAccounts[i], debitAmounts[i], debitHolds[i] = pgUUID(d.Account.Merchant), pgUUID(d.Account.ID), d.Amount, d.Hold
	}
	args["debit_merchants"], args["debit_accounts"], args["debit_amounts"], args["debit_holds"] = debitMerchants, debitAccounts, debitAmounts, debitHolds
	return args, nil
}

// chargeRowArgs gives the columns of chargeRowsSQL: w's charges, their
// events and its keys' rows, everything writeChargesSQL and writeAheadSQL
// read but the debits.
func chargeRowArgs(w *chargedb.Writes) (pgx.NamedArgs, error) {
	n := len(w.Charges)
	var (
		chargeMerchants, chargeIDs, chargeAccounts, eventIDs = make([]pgtype.UUID, n), make([]pgtype.UUID, n), make([]pgtype.UUID, n), make([]pgtype.UUID, n)
		amounts, captured                                    = make([]int64, n), make([]int64, n)
		expires                                              = make([]*time.Time, n)
		created                                              = make([]time.Time, n)
		currencies, statuses, failures, eventTypes           = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		descriptions                                         = make([]*string, n)
		metadata, payloads                                   = make([][]byte, n), make([][]byte, n)
	)
	for i, c := range w.Charges {
		var err error
		if metadata[i], err = json.Marshal(c.Charge.Metadata); err != nil {
			return nil, err
		}
		chargeMerchants[i], chargeIDs[i], chargeAccounts[i] = pgUUID(c.Merchant), pgUUID(c.Charge.ID), pgUUID(c.Charge.AccountID)
		amounts[i], currencies[i], statuses[i], failures[i] = c.Charge.Amount, c.Charge.Currency, string(c.Charge.Status), c.Charge.FailureCode
		descriptions[i], eventIDs[i], eventTypes[i], payloads[i] = c.Charge.Description, pgUUID(c.EventID), c.EventType, c.Payload
		captured[i], expires[i], created[i] = c.Charge.AmountCaptured, c.Charge.ExpiresAt, c.Charge.CreatedAt
	}
	k := len(w.Keys)
	var (
		keyMerchants  = make([]pgtype.UUID, k)
		keys          = make([]string, k)
		fingerprints  = make([][]byte, k)
		keyStatuses   = make([]int16, k)
		locations     = make([]*string, k)
		bodies        = make([][]byte, k)
		bodyEncodings = make([]*string, k)
	)
	for i, kr := range w.Keys {
		keyMerchants[i], keys[i], fingerprints[i] = pgUUID(kr.Req.MerchantID), kr.Req.Key, kr.Req.Fingerprint[:]
		keyStatuses[i] = int16(kr.Resp.Status)
		if kr.Resp.Location != "" {
			locations[i] = &kr.Resp.Location
		}
		bodies[i], bodyEncodings[i] = encodeBody(kr.Resp.Body)
	}
	return pgx.NamedArgs{
		"charge_merchants": chargeMerchants, "charge_ids": chargeIDs, "charge_accounts": chargeAccounts, "charge_amounts": amounts,
		"currencies": currencies, "statuses": statuses, "failures": failures, "captured": captured, "expires": expires, "descriptions": descriptions, "metadata": metadata, "created": created,
		"event_ids": eventIDs, "event_types": eventTypes, "payloads": payloads,
		"key_merchants": keyMerchants, "keys": keys, "fingerprints": fingerprints, "key_statuses": keyStatuses,
		"locations": locations, "bodies": bodies, "body_encodings": bodyEncodings,
	}, nil
}

// pgUUID gives id the driver's own uuid type, which it sends as 16 bytes;
// a uuid.UUID goes as text through database/sql's Valuer, and the batch's
// arrays made that a fifth of the service's CPU.
func pgUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// rollback ends a transaction that failed part way; a connection that cannot
// even do that is closed, so the pool never hands out one in a transaction.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}
