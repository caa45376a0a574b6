package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"payments/internal/metrics"
	"payments/internal/postgres"
)

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
	}
	store, err := postgres.Open(ctx, cfg.DatabaseURL, opts)
	if err != nil {
		return config{}, nil, nil, fmt.Errorf("invalid DATABASE_URL: %w", err)
	}
	return cfg, log, store, nil
}
