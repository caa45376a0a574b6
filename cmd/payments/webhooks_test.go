package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/client"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/webhook"
)

// WEBHOOK_ALLOW_PRIVATE_NETWORKS reaches the API through serve's wiring:
// off (the default), a webhook endpoint on a loopback address is refused;
// on, it is created, and serve said so at WARN when it started.
func TestServeWebhookAllowPrivate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	merchant := createMerchant(t, db)
	for _, tc := range []struct {
		setting string
		status  int
	}{{"", http.StatusBadRequest}, {"true", http.StatusCreated}} {
		logs := &testkit.LogBuffer{}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		env := envOf(map[string]string{"DATABASE_URL": db, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "off",
			"RELAY_ENABLED": "false", "SHUTDOWN_DELAY": "0", "WEBHOOK_ALLOW_PRIVATE_NETWORKS": tc.setting})
		go func() { done <- run(ctx, []string{"serve"}, env, io.Discard, logs) }()
		addr := waitForAddr(t, logs)

		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/webhook_endpoints",
			strings.NewReader(`{"url":"http://127.0.0.1:9/hook","events":["*"]}`))
		req.Header.Set("Authorization", "Bearer "+merchant.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", uuid.NewString())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
		if resp.StatusCode != tc.status {
			t.Errorf("WEBHOOK_ALLOW_PRIVATE_NETWORKS=%q: %d %s, want %d", tc.setting, resp.StatusCode, body, tc.status)
		}
		warned := len(testkit.Where(testkit.JSONLog(t, logs.String(), "webhook endpoints may be http URLs on local addresses"), "level", "WARN")) == 1
		if warned != (tc.setting == "true") {
			t.Errorf("WEBHOOK_ALLOW_PRIVATE_NETWORKS=%q: warned at start %v", tc.setting, warned)
		}
	}
}

// serve delivers: an endpoint created over the API on a local receiver
// (WEBHOOK_ALLOW_PRIVATE_NETWORKS on) receives the account.created event of
// an account opened after it, signed so that the Go client's VerifyWebhook
// accepts it with the secret the creation answered, and once acknowledged it
// is not sent again.
func TestServeDeliversWebhooks(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	merchant := createMerchant(t, db)
	type delivery struct {
		body               []byte
		eventID, signature string
	}
	got := make(chan delivery, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- delivery{body, r.Header.Get(webhook.EventIDHeader), r.Header.Get(webhook.SignatureHeader)}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	logs := &testkit.LogBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := envOf(map[string]string{"DATABASE_URL": db, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "off",
		"RELAY_ENABLED": "false", "SHUTDOWN_DELAY": "0", "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true"})
	go func() { done <- run(ctx, []string{"serve"}, env, io.Discard, logs) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
	}()
	addr := waitForAddr(t, logs)
	post := func(path, body string) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+merchant.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", uuid.NewString())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %d %v %v", path, resp.StatusCode, v, err)
		}
		return v
	}
	endpoint := post("/v1/webhook_endpoints", `{"url":"`+receiver.URL+`/hook","events":["account.created"]}`)
	secret, _ := endpoint["secret"].(string)
	account := post("/v1/accounts", `{"currency":"EUR"}`)

	select {
	case d := <-got:
		if err := client.VerifyWebhook(d.body, d.signature, secret, 0); err != nil {
			t.Errorf("the delivery's signature: %v", err)
		}
		var e struct {
			ID, Type string
			Data     struct{ ID string }
		}
		if err := json.Unmarshal(d.body, &e); err != nil || e.Type != "account.created" || e.Data.ID != account["id"] || e.ID != d.eventID {
			t.Errorf("delivered %s (event id header %q), want the account.created event of %v", d.body, d.eventID, account["id"])
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30 s")
	}
	select {
	case d := <-got:
		t.Errorf("delivered again after a 204: %s", d.body)
	case <-time.After(2 * time.Second):
	}
}

// createMerchant makes a merchant named after the test with the CLI, and
// returns its API key.
func createMerchant(t *testing.T, db string) (merchant struct {
	APIKey string `json:"api_key"`
}) {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"merchants", "create", "--name", t.Name()}, envOf(map[string]string{"DATABASE_URL": db}), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &merchant); err != nil {
		t.Fatal(err)
	}
	return merchant
}
