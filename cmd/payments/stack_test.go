package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// stack is the three long-running commands started for real through run on
// one fresh database and an embedded NATS: serve (its relay off), payments
// relay and payments consume, each with its metrics on a port of its own.
type stack struct {
	t      *testing.T
	api    string            // serve's HTTP_ADDR
	scrape map[string]string // command -> its METRICS_ADDR
	apiKey string
	logs   *testkit.LogBuffer
}

// startStack migrates a fresh database, creates a merchant and starts serve,
// relay and consume; the test's cleanup stops them and checks they returned
// nil.
func startStack(t *testing.T) *stack {
	t.Helper()
	env := envOf(map[string]string{"DATABASE_URL": pgtest.NewDatabase(t), "NATS_URL": testkit.StartNATS(t).URL(),
		"HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0", "RELAY_ENABLED": "false", "RELAY_POLL": "100ms",
		"SHUTDOWN_DELAY": "0"})
	var out bytes.Buffer
	if err := run(context.Background(), []string{"merchants", "create", "--name", t.Name()}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var merchant struct {
		APIKey string `json:"api_key"`
	}
	if err := json.Unmarshal(out.Bytes(), &merchant); err != nil || merchant.APIKey == "" {
		t.Fatalf("merchants create printed %q (%v)", out.String(), err)
	}
	s := &stack{t: t, apiKey: merchant.APIKey, logs: &testkit.LogBuffer{}, scrape: map[string]string{}}
	for _, command := range []string{"serve", "relay", "consume"} {
		runUntilCleanup(t, command, env, s.logs)
		s.scrape[command] = waitForMetricsOf(t, s.logs, command)
	}
	s.api = waitForAddr(t, s.logs)
	return s
}

// runUntilCleanup runs command through run with env, logging to logs, until
// the test's cleanup stops it and checks it returned nil.
func runUntilCleanup(t *testing.T, command string, env func(string) string, logs *testkit.LogBuffer) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{command}, env, io.Discard, logs) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("%s returned %v", command, err)
		}
	})
}

// post sends a keyed POST as the merchant and returns the status and body.
func (s *stack) post(path, key, body string) (int, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+s.api+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// account opens an account funded with deposit: two events.
func (s *stack) account(deposit int64) string {
	s.t.Helper()
	status, body := s.post("/v1/accounts", uuid.NewString(), `{"currency":"USD"}`)
	var acct struct{ ID string }
	if err := json.Unmarshal(body, &acct); status != http.StatusCreated || err != nil {
		s.t.Fatalf("create account: %d %s", status, body)
	}
	if status, body := s.post("/v1/accounts/"+acct.ID+"/deposits", uuid.NewString(),
		`{"amount":`+strconv.FormatInt(deposit, 10)+`}`); status != http.StatusCreated {
		s.t.Fatalf("deposit: %d %s", status, body)
	}
	return acct.ID
}

// charge charges the account under key and returns the status: 201, or 402
// for a charge the balance does not cover (recorded as failed, an event too).
func (s *stack) charge(account, key string, amount int64) int {
	s.t.Helper()
	status, body := s.post("/v1/charges", key, `{"account_id":"`+account+`","amount":`+strconv.FormatInt(amount, 10)+`,"currency":"USD"}`)
	if status != http.StatusCreated && status != http.StatusPaymentRequired {
		s.t.Fatalf("charge: %d %s", status, body)
	}
	return status
}

// metrics scrapes command's METRICS_ADDR.
func (s *stack) metrics(command string) string {
	s.t.Helper()
	return scrape(s.t, s.scrape[command])
}

// waitForValue scrapes command until series has the value want, for up to
// 30 s, and returns the last scrape.
func (s *stack) waitForValue(command, series string, want float64) string {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		text := s.metrics(command)
		got, ok := sampleValue(text, series)
		if ok && got == want {
			return text
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s's %s is %v (present: %v), want %v; logs:\n%s", command, series, got, ok, want, s.logs.Tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sampleValue returns the value of one series in a scrape: series is its name
// with its labels as the text format prints them (payments_x{a="b"}).
func sampleValue(text, series string) (float64, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}
