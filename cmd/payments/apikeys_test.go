package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestAPIKeyRotation walks the rotation of docs/operations.md with the real commands while
// serve runs: create a second key, switch to it, revoke the first. serve (a
// separate store, as another replica would be) refuses the revoked key within
// 2 s; the list never shows a secret; mistakes name the problem and fail.
func TestAPIKeyRotation(t *testing.T) {
	const revocationBound = 2 * time.Second
	dbURL := pgtest.NewDatabase(t)
	// Port 0 for metrics too: a make run on this machine holds the default.
	env := envOf(map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0", "RELAY_ENABLED": "false",
		"SHUTDOWN_DELAY": "0"})
	ctx := context.Background()
	cli := func(args ...string) ([]byte, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(ctx, args, env, &out, io.Discard)
		return out.Bytes(), err
	}
	mustJSON := func(v any, args ...string) []byte {
		t.Helper()
		out, err := cli(args...)
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		if err := json.Unmarshal(out, v); err != nil {
			t.Fatalf("%s printed %q: %v", strings.Join(args, " "), out, err)
		}
		return out
	}
	if _, err := cli("migrate", "up"); err != nil {
		t.Fatal(err)
	}
	type key struct {
		KeyID  string `json:"key_id"`
		APIKey string `json:"api_key"`
	}
	var merchant struct {
		MerchantID string `json:"merchant_id"`
		key
	}
	var old, fresh key
	mustJSON(&merchant, "merchants", "create", "--name", "Rotating")
	if !strings.HasPrefix(merchant.KeyID, "key_") || !strings.HasPrefix(merchant.APIKey, "sk_") {
		t.Fatalf("merchants create: %+v", merchant)
	}
	old.KeyID, old.APIKey = merchant.KeyID, merchant.APIKey

	logs := &testkit.LogBuffer{}
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(serveCtx, []string{"serve"}, env, io.Discard, logs) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
		for _, k := range []string{old.APIKey, fresh.APIKey} {
			if k != "" && strings.Contains(logs.String(), k) { // "" until created; every log contains it
				t.Error("an API key appears in the logs")
			}
		}
	})
	addr := waitForAddr(t, logs)
	status := func(apiKey string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/charges", nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := status(old.APIKey); s != http.StatusOK {
		t.Fatalf("the first key: %d", s)
	}

	// Rotate: a new key, clients switch to it, the old one is revoked.
	mustJSON(&fresh, "api-keys", "create", "--merchant", merchant.MerchantID)
	if fresh.KeyID == old.KeyID || fresh.APIKey == old.APIKey || !strings.HasPrefix(fresh.APIKey, "sk_") {
		t.Fatalf("api-keys create: %+v", fresh)
	}
	if s := status(fresh.APIKey); s != http.StatusOK {
		t.Fatalf("the new key: %d", s)
	}
	var list struct {
		MerchantID string `json:"merchant_id"`
		APIKeys    []struct {
			KeyID      string     `json:"key_id"`
			CreatedAt  time.Time  `json:"created_at"`
			LastUsedAt *time.Time `json:"last_used_at"`
			RevokedAt  *time.Time `json:"revoked_at"`
		} `json:"api_keys"`
	}
	// serve writes a key's last use a moment after its request.
	out := mustJSON(&list, "api-keys", "list", "--merchant", merchant.MerchantID)
	for deadline := time.Now().Add(10 * time.Second); len(list.APIKeys) > 0 && list.APIKeys[0].LastUsedAt == nil && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		out = mustJSON(&list, "api-keys", "list", "--merchant", merchant.MerchantID)
	}
	if bytes.Contains(out, []byte("sk_")) || len(list.APIKeys) != 2 || list.APIKeys[0].KeyID != old.KeyID ||
		list.APIKeys[1].KeyID != fresh.KeyID || list.APIKeys[0].LastUsedAt == nil || list.APIKeys[0].RevokedAt != nil {
		t.Fatalf("api-keys list printed %s", out)
	}

	var revoked struct {
		KeyID     string     `json:"key_id"`
		RevokedAt *time.Time `json:"revoked_at"`
	}
	mustJSON(&revoked, "api-keys", "revoke", old.KeyID)
	began := time.Now()
	if revoked.KeyID != old.KeyID || revoked.RevokedAt == nil {
		t.Fatalf("api-keys revoke: %+v", revoked)
	}
	for status(old.APIKey) != http.StatusUnauthorized {
		if time.Since(began) > 2*revocationBound {
			t.Fatalf("serve still accepts the revoked key %s later", time.Since(began))
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(began)
	t.Logf("serve answered the revoked key 401 %s after api-keys revoke returned", took.Round(time.Millisecond))
	if took > revocationBound {
		t.Errorf("the revoked key was accepted for %s, want at most %s", took, revocationBound)
	}
	if s := status(fresh.APIKey); s != http.StatusOK {
		t.Errorf("the new key after the revocation: %d", s)
	}
	mustJSON(&list, "api-keys", "list", "--merchant", merchant.MerchantID)
	if list.APIKeys[0].RevokedAt == nil || list.APIKeys[1].RevokedAt != nil {
		t.Errorf("after the revocation: %+v", list.APIKeys)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"api-keys", "revoke", old.KeyID}, "already revoked: " + old.KeyID + " was revoked at"},
		{[]string{"api-keys", "revoke", "key_0123"}, "unknown API key key_0123"},
		{[]string{"api-keys", "revoke"}, "name the key to revoke"},
		{[]string{"api-keys", "create", "--merchant", uuid.NewString()}, "unknown merchant"},
		{[]string{"api-keys", "list", "--merchant", uuid.NewString()}, "unknown merchant"},
		{[]string{"api-keys", "create", "--merchant", "acme"}, `unknown merchant "acme": a merchant id is a UUID`},
		{[]string{"api-keys", "create"}, "--merchant is required"},
		{[]string{"api-keys", "rotate"}, `unknown api-keys command "rotate"`},
	} {
		out, err := cli(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || len(out) != 0 {
			t.Errorf("%s: %v, printed %q; want an error containing %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
}
