package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

const merchantCommandsUsage = `usage:
  payments merchants create --name NAME   register a merchant; prints its id and its first API key (once)`

// merchants registers a merchant and prints its id, its API key and the key's
// id as JSON.
func merchants(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(merchantCommandsUsage)
	}
	if isHelp(args[0]) {
		_, err := fmt.Fprintln(stdout, merchantCommandsUsage)
		return err
	}
	if args[0] != "create" {
		return fmt.Errorf("unknown merchants command %q\n%s", args[0], merchantCommandsUsage)
	}
	fs := flag.NewFlagSet("merchants create", flag.ContinueOnError)
	name := fs.String("name", "", "the merchant's name (required)")
	dbURL := fs.String("database-url", "", "PostgreSQL connection URL ($DATABASE_URL)")
	if err := parseFlags(fs, args[1:], "usage: payments merchants create --name NAME [flags]", stdout, stderr); err != nil {
		return err
	}
	if strings.TrimSpace(*name) == "" {
		return errors.New("merchants create: --name is required")
	}
	store, err := openAdmin(ctx, "merchants create", *dbURL, getenv, stderr)
	if err != nil {
		return err
	}
	defer store.Close()
	id, key, err := store.RegisterMerchant(ctx, *name)
	if err != nil {
		return fmt.Errorf("create merchant: %w", err)
	}
	return json.NewEncoder(stdout).Encode(map[string]string{"merchant_id": id.String(), "key_id": key.ID, "api_key": key.Secret})
}
