package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
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
	if out := cli("merchants", "list"); out != `{"merchants":[],"has_more":false}`+"\n" {
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
		{[]string{"merchants", "list", "--limit", "0"}, "merchants list: --limit must be from 1 to 1000, got 0"},
		{[]string{"merchants", "list", "--limit", "1001"}, "merchants list: --limit must be from 1 to 1000, got 1001"},
		{[]string{"merchants", "list", "--starting-after", "acme"}, `merchants list: --starting-after "acme": a merchant id is a UUID`},
		{[]string{"merchants", "list", "--starting-after", "00000000-0000-0000-0000-000000000000"},
			"merchants list: unknown merchant 00000000-0000-0000-0000-000000000000"},
	} {
		var out bytes.Buffer
		if err := run(ctx, tc.args, env, &out, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) || out.Len() != 0 {
			t.Errorf("%s: %v, printed %q; want an error containing %q", strings.Join(tc.args, " "), err, out.String(), tc.want)
		}
	}
}

// TestMerchantsListPages: merchants list prints at most --limit merchants
// (100 by default), says in has_more whether more follow and, on stderr, the
// command that prints the next page; paging with --starting-after reads every
// merchant once, oldest first, and merchants created at the same moment in id
// order, so that the order is one and no page repeats or skips one.
func TestMerchantsListPages(t *testing.T) {
	url := pgtest.NewDatabase(t)
	env := envOf(map[string]string{"DATABASE_URL": url})
	ctx := context.Background()
	type page struct {
		Merchants []struct {
			MerchantID string `json:"merchant_id"`
		} `json:"merchants"`
		HasMore bool `json:"has_more"`
	}
	list := func(args ...string) (page, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(ctx, append([]string{"merchants", "list"}, args...), env, &out, &errOut); err != nil {
			t.Fatalf("merchants list %s: %v", strings.Join(args, " "), err)
		}
		var p page
		if err := json.Unmarshal(out.Bytes(), &p); err != nil || strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("merchants list %s printed %q (%v), want one JSON line", strings.Join(args, " "), out.String(), err)
		}
		return p, errOut.String()
	}

	const n = 103 // 100 and 3 by default; 14 pages of 7 and 5
	store, err := postgres.Open(ctx, url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var want []string
	for i := range n {
		id, _, err := store.RegisterMerchant(ctx, fmt.Sprintf("m-%03d", i))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id.String())
	}
	// Seven merchants created at one moment: their order is their ids'.
	tie := want[40:47]
	if _, err := store.Pool().Exec(ctx, `UPDATE merchants SET created_at = (SELECT created_at FROM merchants WHERE id = $1)
WHERE id = ANY($2::uuid[])`, tie[0], tie); err != nil {
		t.Fatal(err)
	}
	slices.Sort(tie)

	first, hint := list()
	if len(first.Merchants) != 100 || !first.HasMore {
		t.Fatalf("merchants list printed %d merchants, has_more %v; want the default page, 100, and more", len(first.Merchants), first.HasMore)
	}
	next := "payments merchants list --limit 100 --starting-after " + first.Merchants[99].MerchantID
	if !strings.Contains(hint, next) {
		t.Errorf("merchants list said %q on stderr, want the next page's command %q", hint, next)
	}

	var got []string
	after := ""
	for pages := 1; ; pages++ {
		args := []string{"--limit", "7"}
		if after != "" {
			args = append(args, "--starting-after", after)
		}
		p, hint := list(args...)
		for _, m := range p.Merchants {
			got = append(got, m.MerchantID)
		}
		if !p.HasMore {
			if last := n - 7*(pages-1); hint != "" || len(p.Merchants) != last {
				t.Errorf("the last page: %d merchants, stderr %q; want %d and nothing said", len(p.Merchants), hint, last)
			}
			break
		}
		if len(p.Merchants) != 7 || pages > n {
			t.Fatalf("page %d holds %d merchants, want 7", pages, len(p.Merchants))
		}
		after = p.Merchants[6].MerchantID
		if !strings.Contains(hint, "--limit 7 --starting-after "+after) {
			t.Errorf("page %d: stderr %q, want the next page's command", pages, hint)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("paging by 7 read %d merchants:\n%v\nwant every one once, oldest first, ties in id order:\n%v", len(got), got, want)
	}
}
