package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// WEBHOOK_ALLOW_PRIVATE_NETWORKS reaches the API through serve's wiring:
// off (the default), a webhook endpoint on a loopback address is refused;
// on, it is created, and serve said so at WARN when it started.
func TestServeWebhookAllowPrivate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"merchants", "create", "--name", t.Name()}, envOf(map[string]string{"DATABASE_URL": db}), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var merchant struct {
		APIKey string `json:"api_key"`
	}
	if err := json.Unmarshal(out.Bytes(), &merchant); err != nil {
		t.Fatal(err)
	}
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
