package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"payments/internal/idempotency"
	"payments/internal/metrics"
	"payments/internal/postgres"
)

// logAbandoned logs what became of a charge whose client left before its
// answer: its merchant and key hash (never the key), the outcome and status.
func logAbandoned(log *slog.Logger, a postgres.AbandonedCharge) {
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
// long-running command shares. m, if not nil, counts expired keys.
func open(ctx context.Context, name string, args []string, getenv func(string) string, stderr io.Writer, m *metrics.Metrics) (config, *slog.Logger, *postgres.Store, error) {
	cfg, err := loadConfig(name, args, getenv, stderr)
	if err != nil {
		return config{}, nil, nil, err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	opts := postgres.Options{MaxConns: cfg.DBMaxConns, KeyWait: cfg.IdempotencyWait, KeyTTL: cfg.IdempotencyTTL, CommitWait: cfg.CommitWait,
		ChargeBatchSize: cfg.ChargeBatchSize, ChargeBatches: cfg.ChargeBatches}
	if m != nil {
		opts.OnExpired = func() { m.Idempotency(metrics.OutcomeExpired) }
		opts.OnAbandoned = func(a postgres.AbandonedCharge) {
			m.ChargeAbandoned(a.Outcome)
			logAbandoned(log, a)
		}
	}
	store, err := postgres.Open(ctx, cfg.DatabaseURL, opts)
	if err != nil {
		return config{}, nil, nil, fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	return cfg, log, store, nil
}

// openAdmin opens a one-connection store for an operator command; dbURL, if
// set, overrides DATABASE_URL.
func openAdmin(ctx context.Context, cmd, dbURL string, getenv func(string) string, stderr io.Writer) (*postgres.Store, error) {
	var cfgArgs []string
	if dbURL != "" {
		cfgArgs = []string{"--database-url", dbURL}
	}
	cfg, err := loadConfig(cmd, cfgArgs, getenv, stderr)
	if err != nil {
		return nil, err
	}
	store, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Options{MaxConns: 1})
	if err != nil {
		return nil, fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	return store, nil
}
