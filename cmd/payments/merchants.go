package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/exactlyonce/payments/internal/postgres"
)

const merchantCommandsUsage = `usage:
  payments merchants create --name NAME   register a merchant; prints its id and its first API key (once)
  payments merchants list                 every merchant, oldest first: id, name, creation, active API keys`

// merchants registers a merchant and prints its id, its API key and the key's
// id, or lists the merchants. It prints JSON.
func merchants(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(merchantCommandsUsage)
	}
	cmd := "merchants " + args[0]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var name *string
	switch {
	case isHelp(args[0]):
		_, err := fmt.Fprintln(stdout, merchantCommandsUsage)
		return err
	case args[0] == "create":
		name = fs.String("name", "", "the merchant's name (required)")
	case args[0] == "list":
	default:
		return fmt.Errorf("unknown merchants command %q\n%s", args[0], merchantCommandsUsage)
	}
	load := addSettings(fs, cmd, getenv)
	if err := parseFlags(fs, args[1:], commandNamed(cmd).usage(), stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q\n%s", cmd, fs.Arg(0), merchantCommandsUsage)
	}
	if name != nil && strings.TrimSpace(*name) == "" {
		return errors.New("merchants create: --name is required")
	}
	store, err := openAdmin(ctx, load)
	if err != nil {
		return err
	}
	defer store.Close()
	if name == nil {
		return listMerchants(ctx, store, stdout)
	}
	id, key, err := store.RegisterMerchant(ctx, *name)
	if err != nil {
		return fmt.Errorf("create merchant: %w", err)
	}
	return json.NewEncoder(stdout).Encode(map[string]string{"merchant_id": id.String(), "key_id": key.ID, "api_key": key.Secret})
}

// listedMerchant is how merchants list prints a merchant.
type listedMerchant struct {
	MerchantID    string    `json:"merchant_id"`
	Name          string    `json:"name"`
	CreatedAt     time.Time `json:"created_at"`
	ActiveAPIKeys int       `json:"active_api_keys"`
}

// listMerchants prints every merchant as one JSON object, as api-keys list
// prints a merchant's keys: {"merchants":[...]}, oldest first.
func listMerchants(ctx context.Context, store *postgres.Store, stdout io.Writer) error {
	all, err := store.ListMerchants(ctx)
	if err != nil {
		return fmt.Errorf("merchants list: %w", err)
	}
	listed := make([]listedMerchant, len(all))
	for i, m := range all {
		listed[i] = listedMerchant{MerchantID: m.ID.String(), Name: m.Name, CreatedAt: m.CreatedAt.UTC(), ActiveAPIKeys: m.ActiveAPIKeys}
	}
	return json.NewEncoder(stdout).Encode(struct {
		Merchants []listedMerchant `json:"merchants"`
	}{listed})
}
