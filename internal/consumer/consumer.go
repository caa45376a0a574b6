// Package consumer is the worked example of a downstream consumer of the event
// stream: it keeps a projection of every account's balance, built from events
// alone, and applies each event exactly once although the broker delivers at
// least once. The inbox row (keyed by event id) and the effect commit in one
// transaction; a redelivered event finds its inbox row and is only acknowledged.
package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// Name is the durable consumer's name on the stream and in the inbox.
const Name = "balances"

// Stats counts what the consumer has done.
type Stats struct {
	Applied    atomic.Int64 // events applied for the first time
	Redelivery atomic.Int64 // events already applied, acknowledged again
	// What failed: a message not received, an event not applied (it is
	// redelivered), an unreadable event (terminated), an acknowledgement lost
	// (the event is redelivered and skipped).
	ReceiveErrors, ApplyErrors, Unreadable, AckErrors atomic.Int64
}

// Consumer applies events to the balance projection.
type Consumer struct {
	inbox *Inbox
	js    jetstream.JetStream
	log   *slog.Logger
	Stats Stats
}

// New returns a consumer reading the payments stream through nc and applying
// it to inbox.
func New(inbox *Inbox, nc *nats.Conn, log *slog.Logger) (*Consumer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Consumer{inbox: inbox, js: js, log: log}, nil
}

// Run consumes until ctx ends, waiting for the stream to exist. It returns nil
// when ctx ends. Every wait for NATS or the database is the service's backoff
// (internal/retry: exponential with full jitter, 250 ms up to 5 s, reset by a
// success), and each kind of failure is logged as one outage (down, still
// down once a minute, up), not once per attempt or per event.
func (c *Consumer) Run(ctx context.Context) error {
	cons := c.attach(ctx)
	if cons == nil {
		return nil // ctx ended
	}
	msgs, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	go func() {
		<-ctx.Done()
		msgs.Stop()
	}()
	receive := retry.NewLoop(c.log, "consumer: receive events", retry.Default)
	apply := retry.NewLoop(c.log, "consumer: apply events", retry.Default)
	for {
		msg, err := msgs.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			c.Stats.ReceiveErrors.Add(1)
			if !receive.Fail(ctx, err) {
				return nil
			}
			continue
		}
		receive.Succeed()
		if !c.process(ctx, msg, apply) {
			return nil
		}
	}
}

// attach creates or finds the durable consumer, waiting for the stream to
// exist; nil when ctx ends first.
func (c *Consumer) attach(ctx context.Context) jetstream.Consumer {
	loop := retry.NewLoop(c.log, "consumer: attach to the stream", retry.Default)
	for {
		cons, err := c.js.CreateOrUpdateConsumer(ctx, payment.EventStream, jetstream.ConsumerConfig{
			Durable:       Name,
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       30 * time.Second,
			MaxAckPending: 1000,
		})
		if err == nil {
			loop.Succeed()
			return cons
		}
		if ctx.Err() != nil || !loop.Fail(ctx, err) {
			return nil
		}
	}
}

// process applies one message and acknowledges it. An event that cannot be
// applied now (the database is down) goes back to the broker, and the
// consumer waits its backoff (apply) before the next one: while the database
// is down it tries one event per wait, not every event it holds. It reports
// false when ctx ended during that wait.
func (c *Consumer) process(ctx context.Context, msg jetstream.Msg, apply *retry.Loop) bool {
	err := c.handle(ctx, msg)
	switch {
	case errors.Is(err, errUnreadable):
		// It will never become readable: stop its redelivery, loudly.
		c.Stats.Unreadable.Add(1)
		c.log.Error("unreadable event terminated", "error", err, "subject", msg.Subject())
		_ = msg.Term()
	case err != nil && ctx.Err() != nil:
		_ = msg.Nak() // stopping: not a failure
		return false
	case err != nil:
		c.Stats.ApplyErrors.Add(1)
		_ = msg.Nak()
		return apply.Fail(ctx, err)
	default:
		apply.Succeed()
		if err := msg.Ack(); err != nil {
			c.Stats.AckErrors.Add(1)
			c.log.Warn("ack event; it will be redelivered and skipped", "error", err)
		}
	}
	return true
}

var errUnreadable = errors.New("unreadable event")

// handle applies one message's effect once.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) error {
	effect, err := Effect(msg.Headers().Get(payment.EventMerchantHeader), msg.Data())
	if err != nil {
		return errors.Join(errUnreadable, err)
	}
	applied, err := c.inbox.ApplyOnce(ctx, Name, effect)
	if err != nil {
		return err
	}
	attrs := []slog.Attr{
		slog.String("event_id", payment.FormatID(payment.PrefixEvent, effect.EventID)),
		slog.String("subject", msg.Subject()),
		slog.String("merchant_id", effect.MerchantID.String()),
		slog.Int64("delta", effect.Delta),
	}
	if effect.AccountID != uuid.Nil {
		attrs = append(attrs, slog.String("account_id", payment.FormatID(payment.PrefixAccount, effect.AccountID)))
	}
	if applied {
		c.Stats.Applied.Add(1)
		c.log.LogAttrs(ctx, slog.LevelInfo, "event applied", attrs...)
	} else {
		c.Stats.Redelivery.Add(1)
		c.log.LogAttrs(ctx, slog.LevelDebug, "event already applied; redelivery skipped", attrs...)
	}
	return nil
}

// Effect reads an event message and returns what it does to its account's
// balance: + for deposits and refunds, − for a charge captured at once
// (charge.succeeded) or later (charge.captured: its amount_captured),
// nothing (but counted) for an account's creation, a failed charge and an
// authorization's hold, void or expiry (a hold is not a debit). An event
// about no account (webhook_endpoint.disabled; a charge at a card processor,
// which names a payment_method, and its refunds) has no AccountID; every
// other must name one.
func Effect(merchant string, body []byte) (BalanceEffect, error) {
	var e struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data struct {
			ID        string `json:"id"`
			AccountID string `json:"account_id"`
			Amount    int64  `json:"amount"`
			// AmountCaptured is what a charge took from the balance.
			AmountCaptured int64 `json:"amount_captured"`
			// PaymentMethod is set on a charge at a card processor, and
			// Status on its refunds: they are about no account.
			PaymentMethod string `json:"payment_method"`
			Status        string `json:"status"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return BalanceEffect{}, fmt.Errorf("decode event: %w", err)
	}
	merchantID, err := uuid.Parse(merchant)
	if err != nil {
		return BalanceEffect{}, fmt.Errorf("merchant header %q: %w", merchant, err)
	}
	eventID, ok := payment.ParseID(payment.PrefixEvent, e.ID)
	if !ok {
		return BalanceEffect{}, fmt.Errorf("event id %q", e.ID)
	}
	effect := BalanceEffect{MerchantID: merchantID, EventID: eventID}
	account := e.Data.AccountID
	card := e.Data.PaymentMethod != "" || (e.Type == payment.EventRefundCreated && e.Data.Status != "" && account == "")
	switch e.Type {
	case payment.EventAccountCreated:
		account = e.Data.ID
	case payment.EventDepositCreated, payment.EventRefundCreated:
		effect.Delta = e.Data.Amount
	case payment.EventChargeSucceeded:
		effect.Delta = -e.Data.Amount
	case payment.EventChargeCaptured:
		effect.Delta = -e.Data.AmountCaptured
	case payment.EventChargeFailed, payment.EventChargeAuthorized, payment.EventChargeVoided, payment.EventChargeExpired:
		// No money moved: a hold is not a debit.
	case payment.EventWebhookEndpointDisabled:
		// About no account: recorded in the inbox, and no balance touched.
		return effect, nil
	case payment.EventChargeProcessing, payment.EventChargeReversing, payment.EventChargeReversed,
		payment.EventChargeRequiresReview:
		// Only a card charge has these states.
	default:
		return BalanceEffect{}, fmt.Errorf("unknown event type %q", e.Type)
	}
	if card {
		// A charge at a card processor, or its refund: the money moved at
		// the processor, not in an account here. Recorded, no balance
		// touched.
		return BalanceEffect{MerchantID: merchantID, EventID: eventID}, nil
	}
	if effect.AccountID, ok = payment.ParseID(payment.PrefixAccount, account); !ok {
		return BalanceEffect{}, fmt.Errorf("%s event without an account id", e.Type)
	}
	return effect, nil
}
