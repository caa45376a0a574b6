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

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/postgres"
)

const merchantCommandsUsage = `usage:
  payments merchants create --name NAME   register a merchant; prints its id and its first API key (once)
  payments merchants list [--limit N] [--starting-after MERCHANT_ID]
                                          the merchants, oldest first, 100 a page by default (at most 1000):
                                          id, name, creation, active API keys; the next page starts after
                                          the last one printed`

// The pages of merchants list: --limit's default and its largest value.
const (
	defaultMerchantPage = 100
	maxMerchantPage     = 1000
)

// merchants registers a merchant and prints its id, its API key and the key's
// id, or lists the merchants. It prints JSON.
func merchants(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(merchantCommandsUsage)
	}
	cmd := "merchants " + args[0]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var (
		name  *string
		limit *int
		after *string
	)
	switch {
	case isHelp(args[0]):
		_, err := fmt.Fprintln(stdout, merchantCommandsUsage)
		return err
	case args[0] == "create":
		name = fs.String("name", "", "the merchant's name (required)")
	case args[0] == "list":
		limit = fs.Int("limit", defaultMerchantPage, fmt.Sprintf("how many merchants a page holds at most, 1 to %d", maxMerchantPage))
		after = fs.String("starting-after", "", "a merchant id, the last of the previous page: the page starts after it")
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
	var q postgres.MerchantQuery
	if limit != nil {
		var err error
		if q, err = merchantQuery(*limit, *after); err != nil {
			return err
		}
	}
	store, err := openAdmin(ctx, load)
	if err != nil {
		return err
	}
	defer store.Close()
	if name == nil {
		return listMerchants(ctx, store, q, stdout, stderr)
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

// merchantQuery checks merchants list's --limit and --starting-after.
func merchantQuery(limit int, after string) (postgres.MerchantQuery, error) {
	if limit < 1 || limit > maxMerchantPage {
		return postgres.MerchantQuery{}, fmt.Errorf("merchants list: --limit must be from 1 to %d, got %d", maxMerchantPage, limit)
	}
	q := postgres.MerchantQuery{Limit: limit}
	if after != "" {
		id, err := uuid.Parse(after)
		if err != nil {
			return postgres.MerchantQuery{}, fmt.Errorf("merchants list: --starting-after %q: a merchant id is a UUID", after)
		}
		q.StartingAfter = &id
	}
	return q, nil
}

// listMerchants prints a page of merchants as one JSON object, as api-keys
// list prints a merchant's keys: {"merchants":[...],"has_more":...}, oldest
// first. When more follow, it says on stderr how to read the next page, so
// that stdout stays one JSON document.
func listMerchants(ctx context.Context, store *postgres.Store, q postgres.MerchantQuery, stdout, stderr io.Writer) error {
	p, err := store.ListMerchants(ctx, q)
	if err != nil {
		return fmt.Errorf("merchants list: %w", err)
	}
	listed := make([]listedMerchant, len(p.Items))
	for i, m := range p.Items {
		listed[i] = listedMerchant{MerchantID: m.ID.String(), Name: m.Name, CreatedAt: m.CreatedAt.UTC(), ActiveAPIKeys: m.ActiveAPIKeys}
	}
	err = json.NewEncoder(stdout).Encode(struct {
		Merchants []listedMerchant `json:"merchants"`
		HasMore   bool             `json:"has_more"`
	}{listed, p.HasMore})
	if err != nil || !p.HasMore {
		return err
	}
	_, err = fmt.Fprintf(stderr, "more merchants follow: payments merchants list --limit %d --starting-after %s\n",
		q.Limit, listed[len(listed)-1].MerchantID)
	return err
}
