// Command chargewalk makes one fresh charge and writes the coverage counters
// of that charge alone. TestChargeWalk (internal/e2e/chargewalk_test.go)
// builds it with coverage, runs it on a migrated database of its own, and
// lists the functions whose counters moved; make charge-walk and make lint
// run that test. It lives under testdata because it is the test's fixture,
// not a command of the service: go list ./... and the service's build do not
// see it.
//
// It is a program and not the test itself because runtime/coverage cannot
// clear counters in a test binary: there the counter mode is known only
// when the test ends (ClearCounters fails with "-covermode=<invalid>").
//
// It wires the service in process as `payments serve` does (no relay, no
// janitor, no sweeps running); makes a merchant, an account, a deposit and
// two warm-up charges over HTTP (the second decided ahead, as the counted
// ones are), so that what runs once per process (a pool's
// first connection, a statement's first preparation) is behind it; then,
// three times, clears the counters, makes ONE charge that succeeds, alone in
// its batch, with no cache hit, and writes the meta-data and the counters
// into a directory of -out of its own (1, 2, 3) before anything shuts down.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/coverage"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments"
	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/postgres"
)

func main() {
	dbURL := flag.String("database-url", "", "a migrated database the walk may write to")
	out := flag.String("out", "", "the directory to write the coverage meta-data and counters into")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *dbURL, *out); err != nil {
		fmt.Fprintln(os.Stderr, "chargewalk:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL, out string) error {
	if dbURL == "" || out == "" {
		return errors.New("usage: chargewalk -database-url URL -out DIR")
	}
	store, err := postgres.Open(ctx, dbURL, postgres.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	// The charge path over the store, as serve wires them with its defaults
	// (IDEMPOTENCY_WAIT and COMMIT_WAIT 5 s, half of 20 connections).
	keys := idempotency.NewKeys(store.Keys, idempotency.KeysOptions{})
	api := httpapi.New(backend{store, keys, charging.New(store, charging.Options{})}, slog.New(slog.NewJSONHandler(io.Discard, nil)), httpapi.Options{
		Spec:  payments.OpenAPI,
		Front: idempotency.NewFront(1000, 1<<20, 24*time.Hour, 5*time.Second),
	})
	srv := httptest.NewServer(api)
	defer srv.Close()
	_, apiKey, err := store.RegisterMerchant(ctx, "chargewalk")
	if err != nil {
		return err
	}
	c := client{base: srv.URL, apiKey: apiKey.Secret}
	account, err := c.post(ctx, "/v1/accounts", `{"currency":"USD"}`)
	if err != nil {
		return err
	}
	charge := `{"account_id":"` + account + `","amount":100,"currency":"USD"}`
	for _, step := range []struct{ path, body string }{
		{"/v1/accounts/" + account + "/deposits", `{"amount":10000}`},
		{"/v1/charges", charge}, // the warm-up charges: the first runs the usual way,
		{"/v1/charges", charge}, // the second is decided ahead, as the walked ones are
	} {
		if _, err := c.post(ctx, step.path, step.body); err != nil {
			return err
		}
	}

	// What the warm-up set going in the background (the notifier's NOTIFY, the
	// confirmation round that follows it, internal/postgres/rounds.go) ends
	// before the count begins, as it would between two charges apart.
	time.Sleep(settle)
	for walk := 1; walk <= walks; walk++ {
		if err := coverage.ClearCounters(); err != nil {
			return fmt.Errorf("%w (build with go build -cover -covermode=atomic -coverpkg=github.com/exactlyonce/payments/...)", err)
		}
		if _, err := c.post(ctx, "/v1/charges", charge); err != nil {
			return err
		}
		// The notifier wakes the relay after the commit, and a confirmation
		// round confirms it 50 ms later, each on a goroutine of its own: let
		// them run, so that every walk counts them.
		time.Sleep(settle)
		dir := filepath.Join(out, strconv.Itoa(walk))
		if err := os.Mkdir(dir, 0o750); err != nil {
			return err
		}
		if err := coverage.WriteMetaDir(dir); err != nil {
			return err
		}
		if err := coverage.WriteCountersDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// walks is how many charges are counted, each on its own (in out/1, out/2,
// ...). A function of the walk is one that every one of them ran: once in a
// while a charge or its NOTIFY lands on a pool connection that has not yet
// encoded a parameter of some type, and pgx then builds that connection's
// encode plan (calling internal/postgres's tryWrapUUIDEncodePlan), which
// is the connection's warm-up, not the charge's work.
const walks = 3

// settle is how long the walk lets the background work a charge sets going
// run: the notifier's NOTIFY at once, the confirmation round after 50 ms.
const settle = 300 * time.Millisecond

// backend is what the API is given: the store, and the charge path in
// front of it.
type backend struct {
	*postgres.Store
	*idempotency.Keys[payment.Ledger]
	*charging.Path
}

// client makes the walk's requests: each POST with a new Idempotency-Key,
// answered 201 with an object whose id it returns; a charge must succeed.
type client struct{ base, apiKey string }

func (c client) post(ctx context.Context, path, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(b))
	}
	var obj struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(b, &obj); err != nil {
		return "", err
	}
	if obj.Status != "" && obj.Status != "succeeded" {
		return "", errors.New("POST " + path + ": the charge " + obj.Status + ", want succeeded")
	}
	return obj.ID, nil
}
