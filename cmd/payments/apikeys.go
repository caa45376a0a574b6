package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/postgres"
)

const keyCommandsUsage = `usage:
  payments api-keys create --merchant ID   give the merchant a new API key; prints it once
  payments api-keys list --merchant ID     the merchant's keys: ids, creation, last use, revocation
  payments api-keys revoke KEY_ID          refuse the key from now on (every replica within 2 s)`

// apiKeys creates, lists and revokes merchants' API keys. It prints JSON; the
// secret only once, on creation.
func apiKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(keyCommandsUsage)
	}
	if isHelp(args[0]) {
		_, err := fmt.Fprintln(stdout, keyCommandsUsage)
		return err
	}
	cmd := "api-keys " + args[0]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var merchantFlag *string
	switch args[0] {
	case "create", "list":
		merchantFlag = fs.String("merchant", "", "the merchant's id (required)")
	case "revoke":
	default:
		return fmt.Errorf("unknown api-keys command %q\n%s", args[0], keyCommandsUsage)
	}
	load := addSettings(fs, cmd, getenv)
	synopsis := commandNamed(cmd).usage()
	if err := parseFlags(fs, args[1:], synopsis, stdout, stderr); err != nil {
		return err
	}
	// revoke takes one KEY_ID, before or after the flags.
	var keyID string
	if merchantFlag == nil {
		if fs.NArg() == 0 {
			return fmt.Errorf("%s: name the key to revoke: payments api-keys revoke KEY_ID", cmd)
		}
		keyID = fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:], synopsis, stdout, stderr); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q\n%s", cmd, fs.Arg(0), keyCommandsUsage)
	}
	merchant, err := merchantOf(cmd, merchantFlag)
	if err != nil {
		return err
	}
	store, err := openAdmin(ctx, load)
	if err != nil {
		return err
	}
	defer store.Close()
	enc := json.NewEncoder(stdout)
	switch args[0] {
	case "create":
		key, err := store.CreateAPIKey(ctx, merchant)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		return enc.Encode(map[string]string{"key_id": key.ID, "api_key": key.Secret})
	case "list":
		keys, err := store.ListAPIKeys(ctx, merchant)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		listed := make([]listedKey, len(keys))
		for i, k := range keys {
			listed[i] = listedKeyOf(k)
		}
		return enc.Encode(struct {
			MerchantID string      `json:"merchant_id"`
			APIKeys    []listedKey `json:"api_keys"`
		}{merchant.String(), listed})
	default:
		k, err := store.RevokeAPIKey(ctx, keyID)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		return enc.Encode(listedKeyOf(k))
	}
}

// merchantOf is the merchant that --merchant (given) names, for cmd; none when
// cmd takes no --merchant (given nil).
func merchantOf(cmd string, given *string) (uuid.UUID, error) {
	if given == nil {
		return uuid.Nil, nil
	}
	if *given == "" {
		return uuid.Nil, fmt.Errorf("%s: --merchant is required", cmd)
	}
	merchant, err := uuid.Parse(*given)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%s: unknown merchant %q: a merchant id is a UUID", cmd, *given)
	}
	return merchant, nil
}

// listedKey is how api-keys prints a key: never its secret or hash.
type listedKey struct {
	KeyID      string     `json:"key_id"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

func listedKeyOf(k postgres.APIKey) listedKey {
	utc := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		u := t.UTC()
		return &u
	}
	return listedKey{KeyID: k.ID, CreatedAt: k.CreatedAt.UTC(), LastUsedAt: utc(k.LastUsedAt), RevokedAt: utc(k.RevokedAt)}
}
