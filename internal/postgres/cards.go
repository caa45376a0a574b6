package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// CardDB is the store of card charges (carddb.Store, the port the use case
// internal/cards declares): the keyed write that starts a charge
// (BeginKeyed, whose algorithm is idempotency.Keys's), the operations at the
// processor and their transitions. Its SQL is cardsql.go's; it runs nothing
// of its caller's inside a transaction.
type CardDB struct{ *db }

// NewCardDB returns the card charges' store on the handle d.
func NewCardDB(d *DB) *CardDB { return &CardDB{d.db} }

var _ carddb.Store = (*CardDB)(nil)

// BeginKeyed begins the keyed write that starts a card charge.
func (s *CardDB) BeginKeyed(ctx context.Context) (idempotency.Tx[carddb.Tx], error) {
	k, err := s.beginKeyTx(ctx)
	if err != nil {
		return nil, err
	}
	return &cardTx{keyTx: k}, nil
}

// cardTx is a keyed write whose work is a card charge's start (carddb.Tx).
type cardTx struct {
	*keyTx
	events bool
}

func (t *cardTx) Work() carddb.Tx { return t }

// Commit commits and, when the start wrote its event, wakes the relay.
func (t *cardTx) Commit(ctx context.Context) error {
	if err := t.keyTx.Commit(ctx); err != nil {
		return err
	}
	if t.events {
		t.db.eventsCommitted()
	}
	return nil
}

// InsertCharge inserts the card charge in processing, with the commit
// (keyTx.atCommit): its created_at is the transaction's clock, which the claim
// read.
func (t *cardTx) InsertCharge(_ context.Context, merchant uuid.UUID, c payment.Charge) (time.Time, error) {
	t.atCommit(insertCardChargeSQL, merchant, c.ID, c.PaymentMethod, c.Amount, c.Currency, c.Description, nonNil(c.Metadata))
	return t.now, nil
}

// InsertOperation inserts the charge's operation and its event, with the
// commit.
func (t *cardTx) InsertOperation(_ context.Context, s carddb.Start) error {
	o := s.Op
	t.atCommit(insertOperationSQL, pgx.NamedArgs{
		"merchant": o.Merchant, "id": o.ID, "charge": o.ChargeID, "kind": o.Kind, "processor": o.Processor,
		"key": o.ProcessorKey, "amount": o.Amount, "currency": o.Currency, "payment_method": o.PaymentMethod, "capture": o.Capture,
		"decision_after": s.DecisionAfter, "check_after": s.CheckAfter,
		"event_id": s.Event.ID, "event_type": s.Event.Type, "payload": s.Event.Payload,
	})
	t.events = true
	return nil
}

// Operation returns the merchant's operation with its charge.
func (s *CardDB) Operation(ctx context.Context, merchant, id uuid.UUID) (o carddb.Operation, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error { return readErr("processor operation", scanOperation(row, &o)) },
		operationSQL, merchant, id)
	return o, err
}

// OperationByReference returns the operation our reference names.
func (s *CardDB) OperationByReference(ctx context.Context, id uuid.UUID) (o carddb.Operation, err error) {
	err = s.readRow(ctx, func(row pgx.Row) error { return readErr("processor operation", scanOperation(row, &o)) },
		operationByReferenceSQL, id)
	return o, err
}

// Transition writes t if its operation is still in t.From. When it stores
// the key's response, it takes the key's advisory lock first, as every
// writer of a key's row does (internal/charging/charging.go: lock order).
//
// A transition that brings no processor's event and no operator's
// settlement goes in one round trip (pipelined.go): not applied, it wrote
// nothing, and its COMMIT commits nothing.
func (s *CardDB) Transition(ctx context.Context, t carddb.Transition) (carddb.Written, error) {
	args := transitionArgs(t)
	var (
		applied, inbound int
		answeredAt       *time.Time
	)
	if t.Inbound.ID == "" && t.Resolution == nil {
		return s.compareAndSet(ctx, compareAndSet{merchant: t.Merchant, op: t.Operation, from: t.From, to: t.To,
			lockKey: t.Answer != nil, events: t.Event.Type != "", sql: transitionSQL, args: args, extra: []any{&inbound}})
	}
	err := s.inTxRetried(ctx, func(tx pgx.Tx) error {
		if t.Answer != nil {
			if _, err := tx.Exec(ctx, lockOperationKeySQL, t.Merchant, t.Operation); err != nil {
				return fmt.Errorf("lock the operation's key: %w", err)
			}
		}
		if err := tx.QueryRow(ctx, transitionSQL, args).Scan(&applied, &answeredAt, &inbound); err != nil {
			return err
		}
		if t.Inbound.ID != "" && applied == 0 {
			// The event is recorded only with the change it brings: the
			// caller decides again from where the operation now is.
			return errNotApplied
		}
		if t.Resolution != nil && applied > 0 {
			return insertResolution(ctx, tx, t)
		}
		return nil
	})
	switch {
	case errors.Is(err, errNotApplied) && inbound == 0:
		return carddb.Written{}, carddb.ErrDuplicateEvent
	case errors.Is(err, errNotApplied):
		return carddb.Written{}, nil
	case err != nil:
		return carddb.Written{}, asUnavailable(fmt.Errorf("processor operation %s to %s: %w", t.From, t.To, err))
	}
	if applied > 0 && t.Event.Type != "" {
		s.eventsCommitted()
	}
	return written(applied, answeredAt), nil
}

// insertResolution writes the audit row of the operator's settlement that
// brought t, in t's transaction, after its change.
func insertResolution(ctx context.Context, tx pgx.Tx, t carddb.Transition) error {
	r := t.Resolution
	tag, err := tx.Exec(ctx, insertResolutionSQL, pgx.NamedArgs{
		"merchant": t.Merchant, "id": t.Operation, "resolution_id": r.ID, "from": string(t.From), "as": r.As,
		"status": string(t.Charge.Status), "reason": r.Reason, "operator": r.Operator,
	})
	switch {
	case err != nil:
		return fmt.Errorf("insert charge resolution: %w", err)
	case tag.RowsAffected() != 1:
		return fmt.Errorf("insert charge resolution: %d rows written, not 1", tag.RowsAffected())
	}
	return nil
}

// errNotApplied rolls back a transition that was not applied, with its
// processor's event.
var errNotApplied = errors.New("transition not applied")

func transitionArgs(t carddb.Transition) pgx.NamedArgs {
	c := t.Charge
	a := pgx.NamedArgs{
		"merchant": t.Merchant, "id": t.Operation, "from": string(t.From), "to": string(t.To),
		"psp": t.PSPReference, "check_after": t.CheckAfter,
		"attempts": t.Attempts, "reversal_attempts": t.ReversalAttempts, "reversal_round": t.ReversalRound,
		"last_code": t.LastCode,
		"status":    string(c.Status), "failure_code": c.FailureCode, "decline_code": c.DeclineCode, "amount_captured": c.AmountCaptured,
		"event_id": t.Event.ID, "event_type": t.Event.Type, "payload": t.Event.Payload,
		"answer_status": 0, "answer_location": "", "answer_body": []byte(nil), "answer_encoding": (*string)(nil),
		"inbound_id": t.Inbound.ID, "inbound_type": t.Inbound.Type,
	}
	if t.Event.Type == "" {
		a["event_id"], a["payload"] = uuid.Nil, []byte("null")
	}
	if t.Answer != nil {
		body, encoding := encodeBody(t.Answer.Body)
		a["answer_status"], a["answer_location"], a["answer_body"], a["answer_encoding"] = t.Answer.Status, t.Answer.Location, body, encoding
	}
	return a
}

// Status returns the key's response, once stored, and the charge.
func (s *CardDB) Status(ctx context.Context, merchant, id uuid.UUID) (carddb.Status, error) {
	var (
		st       carddb.Status
		status   *int32
		location string
		body     []byte
		encoding *string
		storedAt *time.Time
		at       time.Time
	)
	err := s.readRow(ctx, func(row pgx.Row) error {
		dest := append([]any{&status, &location, &body, &encoding, &storedAt}, chargeDest(&st.Charge, &at)...)
		return readErr("processor operation", row.Scan(dest...))
	}, operationStatusSQL, merchant, id)
	if err != nil {
		return carddb.Status{}, err
	}
	st.Charge = st.Charge.At(at)
	if status == nil {
		return st, nil
	}
	st.Answered, st.Answer.Status, st.Answer.Location = true, int(*status), location
	if storedAt != nil {
		st.StoredAt = *storedAt
	}
	if st.Answer.Body, err = decodeBody(body, encoding); err != nil {
		return carddb.Status{}, err
	}
	return st, nil
}

// Claim leases the due operations in a short transaction of its own.
func (s *CardDB) Claim(ctx context.Context, processor string, lease time.Duration, limit int) ([]carddb.Operation, error) {
	var ops []carddb.Operation
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, claimOperationsSQL, lease, limit, processor)
		if err != nil {
			return err
		}
		ops, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (carddb.Operation, error) {
			var o carddb.Operation
			return o, scanOperation(row, &o)
		})
		return err
	})
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("claim processor operations: %w", err))
	}
	return ops, nil
}

// RecordEvent records a processor's event that changed nothing.
func (s *CardDB) RecordEvent(ctx context.Context, merchant, op uuid.UUID, in carddb.Inbound) (bool, error) {
	tag, err := s.pool.Exec(ctx, recordProcessorEventSQL, merchant, in.ID, op, in.Type)
	s.transactionEnded()
	if err != nil {
		return false, asUnavailable(fmt.Errorf("record processor event: %w", err))
	}
	return tag.RowsAffected() == 1, nil
}

// Open counts the open operations and those in review.
func (s *CardDB) Open(ctx context.Context) (carddb.OpenOperations, error) {
	var (
		o      carddb.OpenOperations
		oldest float64
	)
	if err := s.pool.QueryRow(ctx, openOperationsSQL).Scan(&o.Open, &o.InReview, &oldest); err != nil {
		return carddb.OpenOperations{}, asUnavailable(fmt.Errorf("count open processor operations: %w", err))
	}
	o.Oldest = time.Duration(oldest * float64(time.Second))
	return o, nil
}

// scanOperation reads a row of operationColumns followed by chargeColumns.
func scanOperation(row pgx.Row, o *carddb.Operation) error {
	var state string
	dest := []any{&o.Merchant, &o.ID, &o.ChargeID, &o.Kind, &state, &o.Processor, &o.ProcessorKey, &o.Amount, &o.Currency,
		&o.PaymentMethod, &o.Capture, &o.PSPReference, &o.DecisionDeadline, &o.NextCheckAt, &o.Attempts,
		&o.ReversalAttempts, &o.ReversalRound, &o.LastCode, &o.CreatedAt}
	if err := row.Scan(append(dest, chargeDest(&o.Charge, &o.Now)...)...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return fmt.Errorf("scan processor operation: %w", err)
	}
	o.State = carddb.State(state)
	return nil
}
