package payment

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// The outbox, as the relay sees it: events committed with the changes they
// describe, published by one leader at a time. The store implements it.

// Where events are published: the JetStream stream, the prefix of every
// subject (payments.<event type>), and the header carrying the merchant.
const (
	EventStream         = "PAYMENTS"
	EventSubjectPrefix  = "payments."
	EventMerchantHeader = "Payments-Merchant-Id"
)

// ErrNotLeader reports that another process holds the outbox lease.
var ErrNotLeader = errors.New("another relay holds the outbox lease")

// OutboxEvent is an event waiting to be published, with its merchant.
type OutboxEvent struct {
	MerchantID uuid.UUID
	Event
}

// Outbox hands out the lease that makes its holder the one relay publishing.
type Outbox interface {
	// ClaimOutbox makes the caller the leader, or returns ErrNotLeader when
	// another process is, or ErrUnavailable when the database is not there.
	ClaimOutbox(ctx context.Context) (OutboxLease, error)
}

// OutboxLease is the leader's hold on the outbox. It ends with Close, or when
// its connection dies, and then another process may take over.
type OutboxLease interface {
	// Unpublished returns up to limit events not yet published, in feed order.
	Unpublished(ctx context.Context, limit int) ([]OutboxEvent, error)
	// MarkPublished records that the broker stored these events: a prefix,
	// in order, of what Unpublished last returned.
	MarkPublished(ctx context.Context, events []OutboxEvent) error
	// Wait returns when events may have committed, or after d.
	Wait(ctx context.Context, d time.Duration) error
	// Prune deletes published events created longer than retention ago,
	// taking up to batch of them in feed order after where its last call
	// ended, and reports how many it deleted and whether to call it again:
	// a pass of calls until more is false walks every aged event once, past
	// those it must keep.
	Prune(ctx context.Context, retention time.Duration, batch int) (deleted int64, more bool, err error)
	// Close gives the lease up.
	Close()
}
