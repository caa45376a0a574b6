package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestMerchantsList: merchants list prints every merchant, oldest first, with
// its active API keys counted (a revoked key is not), as one JSON object like
// api-keys list's, and never a secret.
func TestMerchantsList(t *testing.T) {
	env := envOf(map[string]string{"DATABASE_URL": pgtest.NewDatabase(t)})
	ctx := context.Background()
	cli := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, args, env, &out, io.Discard); err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	if out := cli("merchants", "list"); out != `{"merchants":[]}`+"\n" {
		t.Errorf("merchants list with none printed %q", out)
	}
	type created struct {
		MerchantID string `json:"merchant_id"`
		KeyID      string `json:"key_id"`
	}
	var acme, globex created
	for _, c := range []struct {
		name string
		into *created
	}{{"Acme", &acme}, {"Globex \"Intl\"", &globex}} {
		if err := json.Unmarshal([]byte(cli("merchants", "create", "--name", c.name)), c.into); err != nil {
			t.Fatal(err)
		}
	}
	cli("api-keys", "create", "--merchant", acme.MerchantID)
	cli("api-keys", "revoke", globex.KeyID)

	out := cli("merchants", "list")
	var list struct {
		Merchants []struct {
			MerchantID    string    `json:"merchant_id"`
			Name          string    `json:"name"`
			CreatedAt     time.Time `json:"created_at"`
			ActiveAPIKeys int       `json:"active_api_keys"`
		} `json:"merchants"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || strings.Count(out, "\n") != 1 || strings.Contains(out, "sk_") {
		t.Fatalf("merchants list printed %q (%v), want one JSON line without secrets", out, err)
	}
	m := list.Merchants
	if len(m) != 2 || m[0].MerchantID != acme.MerchantID || m[0].Name != "Acme" || m[0].ActiveAPIKeys != 2 ||
		m[1].MerchantID != globex.MerchantID || m[1].Name != `Globex "Intl"` || m[1].ActiveAPIKeys != 0 ||
		m[0].CreatedAt.Location() != time.UTC || time.Since(m[0].CreatedAt) > time.Minute {
		t.Errorf("merchants list printed %s", out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"merchants", "list", "extra"}, `merchants list: unexpected argument "extra"`},
		{[]string{"merchants", "delete"}, `unknown merchants command "delete"`},
		{[]string{"merchants"}, "payments merchants list"},
	} {
		var out bytes.Buffer
		if err := run(ctx, tc.args, env, &out, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) || out.Len() != 0 {
			t.Errorf("%s: %v, printed %q; want an error containing %q", strings.Join(tc.args, " "), err, out.String(), tc.want)
		}
	}
}
