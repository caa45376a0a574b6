package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/retry"
)

// logAbandoned logs what became of a charge whose client left before its
// answer: its merchant and key hash (never the key), the outcome and status.
func logAbandoned(log *slog.Logger, a charging.AbandonedCharge) {
	attrs := []slog.Attr{
		slog.String("merchant_id", a.Request.MerchantID.String()),
		slog.String("key_hash", idempotency.KeyHash(a.Request.MerchantID, a.Request.Key)),
		slog.String("outcome", a.Outcome),
	}
	if a.Status != 0 {
		attrs = append(attrs, slog.Int("status", a.Status))
	}
	if a.Err != nil {
		attrs = append(attrs, slog.String("error", a.Err.Error()))
	}
	log.LogAttrs(context.Background(), slog.LevelInfo, "charge abandoned by its client", attrs...)
}

// open reads the configuration and opens the store, the start every
// long-running command shares.
func open(ctx context.Context, name string, args []string, getenv func(string) string, stdout, stderr io.Writer) (config, *slog.Logger, *postgres.Store, error) {
	cfg, log, err := configure(name, args, getenv, stdout, stderr)
	if err != nil {
		return config{}, nil, nil, err
	}
	store, err := postgres.Open(ctx, cfg.DatabaseURL, storeOptions(cfg))
	if err != nil {
		return config{}, nil, nil, fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	return cfg, log, store, nil
}

// configure reads a command's configuration and makes its log, on stderr.
func configure(name string, args []string, getenv func(string) string, stdout, stderr io.Writer) (config, *slog.Logger, error) {
	cfg, err := loadConfig(name, args, getenv, stdout, stderr)
	if err != nil {
		return config{}, nil, err
	}
	// One record of the process's outages: its retry loops losing the
	// database together warn as one (retry.SharedOutages).
	return cfg, slog.New(retry.SharedOutages(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))), nil
}

// storeOptions are the store's settings from cfg: its pool's, and the keys'
// TTL (zero, the store's default, in a command that reads no keys' room and
// uses no key). IDEMPOTENCY_WAIT has three jobs there, each an option of its
// own: every lock wait (lock_timeout, above all a key's wait behind its twin
// in flight), the wait for a pooled connection, and an API key's lookup.
func storeOptions(cfg config) postgres.Options {
	p := cfg.Pool
	return postgres.Options{MaxConns: p.MaxConns, KeyTTL: cfg.Keys.TTL, CommitWait: p.CommitWait,
		KeyWait: p.KeyWait, AcquireWait: p.KeyWait, LookupWait: p.KeyWait}
}

// backend is what the HTTP API runs on: the store, and in front of it the
// keyed writes on the ledger (idempotency.Keys, which answer Idempotent) and
// the charge use case (charging.Path, which answers CreateCharge and Ready).
type backend struct {
	*postgres.Store
	*idempotency.Keys[payment.Ledger]
	*charging.Path
	drain *drain
}

// openKeys returns the keyed writes on store's ledger, keys kept for
// IDEMPOTENCY_TTL, each one found expired counted on m.
func openKeys(cfg config, store *postgres.Store, m *metrics.Metrics) *idempotency.Keys[payment.Ledger] {
	return idempotency.NewKeys(store.Keys, idempotency.KeysOptions{TTL: cfg.Keys.TTL,
		OnExpired: func() { m.Idempotency(metrics.OutcomeExpired) }})
}

// Ready is the charge path's readiness, and not ready from the moment the
// drain starts.
func (b backend) Ready(ctx context.Context) error {
	if err := b.drain.ready(); err != nil {
		return err
	}
	return b.Path.Ready(ctx)
}

// openCharging starts the charge use case over store, with the bounds the
// store has (IDEMPOTENCY_WAIT, COMMIT_WAIT, half of DB_MAX_CONNS for the
// charges waiting outside a batch), its batcher's series on m, and each
// abandoned charge counted and logged. IDEMPOTENCY_WAIT (KeyWait) bounds a
// charge's wait for a batch and, after its batch, for a key in flight or a
// locked account; with COMMIT_WAIT it says when a batch is stuck.
func openCharging(cfg config, store *postgres.Store, log *slog.Logger, m *metrics.Metrics) *charging.Path {
	path := charging.New(store, charging.Options{
		BatchSize: cfg.Charges.BatchSize, Batches: cfg.Charges.Batches,
		KeyWait: cfg.Pool.KeyWait, CommitWait: cfg.Pool.CommitWait, Waiters: max(1, int(cfg.Pool.MaxConns)/2),
		AuthorizationTTL: cfg.Charges.AuthorizationTTL,
		OnAbandoned: func(a charging.AbandonedCharge) {
			m.ChargeAbandoned(a.Outcome)
			logAbandoned(log, a)
		},
	})
	m.ChargeBatcher(path.Stats, path.StuckAfter())
	m.ChargeAhead(path.AheadStats)
	return path
}

// openAdmin opens a one-connection store, for an operator command, on the
// database of the configuration load reads (its database room alone).
func openAdmin(ctx context.Context, load func() (config, error)) (*postgres.Store, error) {
	cfg, err := load()
	if err != nil {
		return nil, err
	}
	store, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Options{MaxConns: 1})
	if err != nil {
		return nil, fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	return store, nil
}
