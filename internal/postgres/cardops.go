package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/payment"
)

// Captures, voids and refunds of card charges (carddb.FollowUpTx,
// carddb.FollowUps): the keyed write that starts one locks its charge and
// inserts the operation (and a refund's row, pending); Settle ends it. The
// lock order is cardsql.go's: a key's advisory lock, then the operation, its
// charge (then its refund), and the key's row.

const (
	// lockCardChargeSQL locks a card charge. What a capture, void or
	// refund is decided by is read by the next statement (cardChargeSQL),
	// whose snapshot comes after the lock: a statement that waited for the
	// lock sees the row as it is, but its subqueries as they were when it
	// started, which would miss a refund reserved by the lock's holder.
	lockCardChargeSQL = `
SELECT 1 FROM charges WHERE merchant_id = $1 AND id = $2 AND payment_method IS NOT NULL FOR UPDATE`

	// cardChargeSQL reads the locked card charge, its authorization's psp
	// reference and processor (an authorization's id is its charge's), its
	// refunds in flight and its capture or void in flight.
	cardChargeSQL = `
SELECT ` + chargeColumns + `, coalesce(c.psp_reference, ''),
       coalesce((SELECT o.processor FROM processor_operations o WHERE o.merchant_id = c.merchant_id AND o.id = c.id), ''),
       (SELECT coalesce(sum(r.amount), 0)::bigint FROM refunds r
        WHERE r.merchant_id = c.merchant_id AND r.charge_id = c.id AND r.status = 'pending'),
       coalesce((SELECT o.kind FROM processor_operations o
                 WHERE o.merchant_id = c.merchant_id AND o.charge_id = c.id AND o.kind IN ('capture', 'void')
                   AND o.state IN ('processing', 'requires_review') LIMIT 1), '')
FROM charges c WHERE c.merchant_id = $1 AND c.id = $2`

	// insertFollowUpSQL inserts the operation, its bounds counted from the
	// transaction's clock, and a refund's row, pending, with that clock
	// (which the key's claim returned).
	insertFollowUpSQL = `
WITH op AS (
    INSERT INTO processor_operations (merchant_id, id, charge_id, kind, state, processor, processor_key, amount,
                                      currency, payment_method, capture, psp_reference, decision_deadline, next_check_at)
    VALUES (@merchant, @id, @charge, @kind, 'processing', @processor, @key, @amount, @currency,
            @payment_method, false, nullif(@psp::text, ''), now() + @review_after::interval, now() + @check_after::interval)
), refund AS (
    INSERT INTO refunds (merchant_id, id, charge_id, amount, currency, status, created_at)
    SELECT @merchant, @id, @charge, @amount, @currency, 'pending', now() WHERE @refund::boolean
)
SELECT now()`

	// settleFollowUpSQL is a compare-and-set on the operation's state: the
	// operation, its charge's change, its refund's status, the event and
	// the key's response are written only if it is still in @from.
	settleFollowUpSQL = `
WITH op AS (
    UPDATE processor_operations
    SET state = @to, next_check_at = CASE WHEN @to::text = 'processing' THEN now() + @check_after::interval END,
        attempts = @attempts, last_code = nullif(@last_code::text, ''),
        resolved_at = CASE WHEN @to::text <> 'processing' THEN clock_timestamp() END
    WHERE merchant_id = @merchant AND id = @id AND state = @from
    RETURNING charge_id
), charge AS (
    UPDATE charges
    SET status = coalesce(nullif(@status::text, ''), status),
        amount_captured = CASE WHEN @status::text <> '' THEN @amount_captured::bigint ELSE amount_captured END,
        amount_refunded = amount_refunded + @refunded::bigint
    WHERE merchant_id = @merchant AND id = (SELECT charge_id FROM op) AND (@status::text <> '' OR @refunded::bigint <> 0)
), refund AS (
    UPDATE refunds SET status = @refund_status::text
    WHERE merchant_id = @merchant AND id = @id AND @refund_status::text <> '' AND EXISTS (SELECT FROM op)
), event AS (
    INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
    SELECT @merchant::uuid, @event_id::uuid, @aggregate::text, @aggregate_id::uuid, @event_type::text, @payload::jsonb
    FROM op WHERE @event_type::text <> ''
), answer AS (
    UPDATE idempotency_keys
    SET status = @answer_status::smallint, location = nullif(@answer_location::text, ''), body = @answer_body::bytea,
        body_encoding = @answer_encoding::text, created_at = clock_timestamp()
    WHERE merchant_id = @merchant AND operation_id = @id AND status IS NULL
      AND @answer_status::smallint > 0 AND EXISTS (SELECT FROM op)
    RETURNING created_at
)
SELECT (SELECT count(*) FROM op), (SELECT created_at FROM answer)`

	refundByOwnIDSQL = `SELECT ` + refundColumns + ` FROM refunds WHERE merchant_id = $1 AND id = $2`
)

// LockCardCharge locks the card charge and reads what a capture, void or
// refund of it is decided by.
func (t *cardTx) LockCardCharge(ctx context.Context, merchant, id uuid.UUID) (carddb.LockedCharge, error) {
	var (
		l   carddb.LockedCharge
		one int
	)
	err := t.q.QueryRow(ctx, lockCardChargeSQL, merchant, id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return carddb.LockedCharge{}, payment.ErrNotFound
	}
	if err != nil {
		return carddb.LockedCharge{}, fmt.Errorf("lock card charge: %w", err)
	}
	dest := append(chargeDest(&l.Charge, &l.Now), &l.PSPReference, &l.Processor, &l.Refunding, &l.Settling)
	if err := t.q.QueryRow(ctx, cardChargeSQL, merchant, id).Scan(dest...); err != nil {
		return carddb.LockedCharge{}, fmt.Errorf("read card charge: %w", err)
	}
	return l, nil
}

// InsertFollowUp inserts the operation, and a refund's row, pending, with
// the commit (keyTx.atCommit); it returns the transaction's clock, which the
// claim read.
func (t *cardTx) InsertFollowUp(_ context.Context, f carddb.FollowUp) (time.Time, error) {
	o := f.Op
	t.atCommit(insertFollowUpSQL, pgx.NamedArgs{
		"merchant": o.Merchant, "id": o.ID, "charge": o.ChargeID, "kind": o.Kind, "processor": o.Processor,
		"key": o.ProcessorKey, "amount": o.Amount, "currency": o.Currency, "payment_method": o.PaymentMethod, "psp": o.PSPReference,
		"review_after": f.ReviewAfter, "check_after": f.CheckAfter, "refund": f.Refund != nil,
	})
	return t.now, nil
}

// Settle writes s if its operation is still in s.From. When it stores the
// key's response, it takes the key's advisory lock first, as Transition
// does.
//
// It goes in one round trip (pipelined.go): not applied, it wrote nothing,
// and its COMMIT commits nothing.
func (s *CardDB) Settle(ctx context.Context, st carddb.Settlement) (carddb.Written, error) {
	return s.compareAndSet(ctx, compareAndSet{merchant: st.Merchant, op: st.Operation, from: st.From, to: st.To,
		lockKey: st.Answer != nil, events: st.Event.Type != "", sql: settleFollowUpSQL, args: settleArgs(st)})
}

// compareAndSet is one compare-and-set statement on an operation, from one
// state to another: sql with args, whose row starts with whether it was
// applied and when it stored the key's response, then extra's columns.
// lockKey: it stores the key's response; events: it writes an event when
// applied.
type compareAndSet struct {
	merchant, op    uuid.UUID
	from, to        carddb.State
	lockKey, events bool
	sql             string
	args            pgx.NamedArgs
	extra           []any
}

// compareAndSet runs c in one round trip with its transaction
// (pipelined.go): first, when it stores the key's response, the key's
// advisory lock, as every writer of a key's row takes it
// (internal/charging/charging.go: lock order).
func (s *CardDB) compareAndSet(ctx context.Context, c compareAndSet) (carddb.Written, error) {
	var stmts []*pgx.QueuedQuery
	if c.lockKey {
		stmts = append(stmts, &pgx.QueuedQuery{SQL: lockOperationKeySQL, Arguments: []any{c.merchant, c.op}})
	}
	stmts = append(stmts, &pgx.QueuedQuery{SQL: c.sql, Arguments: []any{c.args}})
	var (
		applied    int
		answeredAt *time.Time
	)
	err := s.pipelined(ctx, stmts, func(br pgx.BatchResults) error {
		if c.lockKey {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("lock the operation's key: %w", err)
			}
		}
		return br.QueryRow().Scan(append([]any{&applied, &answeredAt}, c.extra...)...)
	})
	if err != nil {
		return carddb.Written{}, asUnavailable(fmt.Errorf("processor operation %s to %s: %w", c.from, c.to, err))
	}
	if applied > 0 && c.events {
		s.eventsCommitted()
	}
	return written(applied, answeredAt), nil
}

// written is what a compare-and-set reports: applied, and when it stored
// the key's response.
func written(applied int, answeredAt *time.Time) carddb.Written {
	w := carddb.Written{Applied: applied > 0}
	if w.Applied && answeredAt != nil {
		w.AnsweredAt = *answeredAt
	}
	return w
}

func settleArgs(st carddb.Settlement) pgx.NamedArgs {
	a := pgx.NamedArgs{
		"merchant": st.Merchant, "id": st.Operation, "from": string(st.From), "to": string(st.To),
		"check_after": st.CheckAfter, "attempts": st.Attempts, "last_code": st.LastCode,
		"status": "", "amount_captured": int64(0), "refunded": st.Refunded, "refund_status": string(st.RefundStatus),
		"event_id": st.Event.ID, "aggregate": st.EventAggregate, "aggregate_id": st.EventAggregateID,
		"event_type": st.Event.Type, "payload": st.Event.Payload,
		"answer_status": 0, "answer_location": "", "answer_body": []byte(nil), "answer_encoding": (*string)(nil),
	}
	if st.Charge != nil {
		a["status"], a["amount_captured"] = string(st.Charge.Status), st.Charge.AmountCaptured
	}
	if st.Event.Type == "" {
		a["event_id"], a["aggregate_id"], a["payload"] = uuid.Nil, uuid.Nil, []byte("null")
	}
	if st.Answer != nil {
		body, encoding := encodeBody(st.Answer.Body)
		a["answer_status"], a["answer_location"], a["answer_body"], a["answer_encoding"] = st.Answer.Status, st.Answer.Location, body, encoding
	}
	return a
}

// Refund returns the merchant's refund.
func (s *CardDB) Refund(ctx context.Context, merchant, id uuid.UUID) (r payment.Refund, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error { return readErr("refund", row.Scan(refundDest(&r)...)) },
		refundByOwnIDSQL, merchant, id)
	return r, err
}
