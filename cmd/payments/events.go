package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/exactlyonce/payments/internal/consumer"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/relay"
	"github.com/exactlyonce/payments/internal/retry"
)

// connectNATS connects to NATS, retrying in the background if it is down:
// the relay waits outages out, and events wait in the outbox meanwhile.
func connectNATS(url string, log *slog.Logger) (*nats.Conn, error) {
	return connectNATSWith(url, log, retry.Default)
}

// connectNATSWith is connectNATS with the reconnects backing off by p
// (internal/retry: full jitter, reset by a connection), and the connection's
// outages logged as changes of state ("NATS: connection": down, still down
// once a minute, up), not once per attempt. Closing it is no outage.
func connectNATSWith(url string, log *slog.Logger, p retry.Policy) (*nats.Conn, error) {
	conn := retry.NewOutage(log, "NATS: connection")
	failed := func(nc *nats.Conn, err error) {
		if nc.IsClosed() {
			return
		}
		if err == nil {
			err = errors.New("disconnected")
		}
		conn.Failed(err)
	}
	nc, err := nats.Connect(url,
		nats.Name("payments"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(func(attempts int) time.Duration { return conn.Retrying(p, attempts) }),
		nats.DisconnectErrHandler(failed),
		nats.ReconnectErrHandler(failed),
		nats.ReconnectHandler(func(*nats.Conn) { conn.Succeeded() }),
		nats.ConnectHandler(func(*nats.Conn) { conn.Succeeded() }),
	)
	if err != nil {
		return nil, fmt.Errorf("invalid NATS_URL: %w", err)
	}
	return nc, nil
}

// newRelay connects to NATS and returns a relay of store's outbox, its
// series registered on m: the same in serve and in payments relay.
func newRelay(cfg config, store *postgres.Store, log *slog.Logger, m *metrics.Metrics) (*relay.Relay, *nats.Conn, error) {
	nc, err := connectNATS(cfg.NATSURL, log)
	if err != nil {
		return nil, nil, err
	}
	r, err := relay.New(store, nc, log, relay.Options{Batch: cfg.Relay.Batch, Poll: cfg.Relay.Poll, Retention: cfg.Relay.EventRetention,
		Observer: m.Relay(relay.FailureReasons)})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	relayMetrics(m, r)
	return r, nc, nil
}

// relayOnly runs the outbox relay alone until ctx ends, its metrics on
// METRICS_ADDR.
func relayOnly(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, log, store, err := open(ctx, "relay", args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	defer store.Close()
	m := metrics.NewProcess()
	r, nc, err := newRelay(cfg, store, log, m)
	if err != nil {
		return err
	}
	defer nc.Close()
	stopMetrics, err := serveMetrics("relay", cfg.MetricsAddr, m, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	log.Info("relay starting", "nats", cfg.NATSURL)
	err = r.Run(ctx)
	log.Info("relay stopped", "signal", stopSignal(ctx), "error", stopCause(err))
	return err
}

// consume runs the worked-example consumer until ctx ends, its metrics on
// METRICS_ADDR.
func consume(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, log, err := configure("consume", args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	// The consumer keeps its own tables (consumer.Inbox): it needs the
	// database's handle, none of the store's roles.
	db, err := postgres.Connect(ctx, cfg.DatabaseURL, storeOptions(cfg))
	if err != nil {
		return fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	defer db.Close()
	nc, err := connectNATS(cfg.NATSURL, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := consumer.New(consumer.NewInbox(db), nc, log)
	if err != nil {
		return err
	}
	m := metrics.NewProcess()
	consumerMetrics(m, c)
	stopMetrics, err := serveMetrics("consume", cfg.MetricsAddr, m, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	log.Info("consumer starting", "nats", cfg.NATSURL, "durable", consumer.Name)
	err = c.Run(ctx)
	log.Info("consumer stopped", "signal", stopSignal(ctx), "error", stopCause(err))
	return err
}

// outboxSampler reads the outbox and the due webhook deliveries for the
// metrics' sampler (a failure of either fails the sample), and logs a warning
// naming the transaction that holds events back once an event has waited warn
// for it: the feed and the relay list an event only when every older
// transaction of the database has ended (internal/postgres/horizon.go), so a
// long one in this database delays them all, and the operator must see which.
func outboxSampler(monitor *postgres.Monitor, warn time.Duration, log *slog.Logger) func(context.Context) (metrics.OutboxSample, error) {
	return func(ctx context.Context) (metrics.OutboxSample, error) {
		st, err := monitor.Outbox(ctx)
		if err != nil {
			return metrics.OutboxSample{}, err
		}
		if st.Held >= warn && st.Holder != nil {
			attrs := []any{"held", st.Held.Round(time.Millisecond), "xid", st.Holder.XID}
			if st.Holder.PID != 0 {
				attrs = append(attrs, "pid", st.Holder.PID)
			} else {
				attrs = append(attrs, "prepared", true)
			}
			if st.Holder.Age >= 0 {
				attrs = append(attrs, "transaction_age", st.Holder.Age.Round(time.Millisecond))
			}
			log.Warn("events held back by a long transaction in this database", attrs...)
		}
		due, err := monitor.Deliveries(ctx)
		if err != nil {
			return metrics.OutboxSample{}, err
		}
		return metrics.OutboxSample{Backlog: st.Backlog, Oldest: st.Oldest, Held: st.Held,
			DueDeliveries: due.Due, Overdue: due.Overdue}, nil
	}
}

// stopCause is err's text for a command's stop line, or "none".
func stopCause(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}
