// Command chargewalk counts the functions of this module that one fresh
// charge runs, for docs/architecture.md ("What a fresh charge crosses").
// `make charge-walk` builds it with coverage and runs it:
//
//	go build -cover -covermode=atomic -coverpkg=github.com/exactlyonce/payments/... -o bin/chargewalk ./cmd/chargewalk
//	bin/chargewalk -database-url postgres://postgres@127.0.0.1:5432/postgres
//
// It creates a scratch database, migrates it, and wires the service in
// process as `payments serve` does (no relay and no janitor running); it
// makes a merchant, an account, a deposit and one charge over HTTP, so that
// what runs once per process (a pool's first connection, a statement's first
// preparation) is behind it; then it clears the coverage counters, makes ONE
// charge that succeeds, alone in its batch, with no cache hit, and writes the
// counters out. Every function of the module whose counter moved ran for
// that charge, or beside it while it ran (the notifier that wakes the relay
// is part of a charge's path). It prints them by package, from `go tool
// covdata func`, and drops the scratch database.
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
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments"
	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/migrations"
)

func main() {
	admin := flag.String("database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"a server where chargewalk may CREATE DATABASE")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *admin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "chargewalk:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, admin string, stdout io.Writer) error {
	dbURL, drop, err := scratchDatabase(ctx, admin)
	if err != nil {
		return err
	}
	defer drop()
	if err := migrations.Up(dbURL); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	store, err := postgres.Open(ctx, dbURL, postgres.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	// The charge path over the store, as serve wires them (its defaults are
	// the store's: IDEMPOTENCY_WAIT and COMMIT_WAIT 5 s, half of 20
	// connections).
	api := httpapi.New(backend{store, charging.New(store, charging.Options{})}, slog.New(slog.NewJSONHandler(io.Discard, nil)), httpapi.Options{
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
		{"/v1/charges", charge}, // the warm-up charge
	} {
		if _, err := c.post(ctx, step.path, step.body); err != nil {
			return err
		}
	}

	if err := coverage.ClearCounters(); err != nil {
		return fmt.Errorf("%w (build with go build -cover -covermode=atomic -coverpkg=github.com/exactlyonce/payments/...: make charge-walk)", err)
	}
	if _, err := c.post(ctx, "/v1/charges", charge); err != nil {
		return err
	}
	// The notifier wakes the relay after the commit, on a goroutine of its
	// own: let it run, so that every walk counts it.
	time.Sleep(100 * time.Millisecond)
	dir, err := os.MkdirTemp("", "chargewalk")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := coverage.WriteMetaDir(dir); err != nil {
		return err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return err
	}
	return crossed(ctx, dir, stdout)
}

// crossed prints, from `go tool covdata func` on dir, the functions of the
// module that ran, by package, and their number.
func crossed(ctx context.Context, dir string, stdout io.Writer) error {
	raw, err := exec.CommandContext(ctx, "go", "tool", "covdata", "func", "-i="+dir).Output() //nolint:gosec // G204: dir is this process's own temporary directory
	if err != nil {
		return fmt.Errorf("go tool covdata func: %w", err)
	}
	byPkg := map[string][]string{}
	total := 0
	for line := range strings.Lines(string(raw)) {
		// payments/internal/httpapi/handlers.go:123:	createCharge		100.0%
		f := strings.Fields(line)
		if len(f) != 3 || f[2] == "0.0%" || !strings.HasPrefix(f[0], "github.com/exactlyonce/payments/") {
			continue
		}
		file, _, _ := strings.Cut(f[0], ":")
		pkg := strings.TrimPrefix(filepath.Dir(file), "github.com/exactlyonce/payments/")
		if pkg == "cmd/chargewalk" {
			continue // the walk's own client
		}
		byPkg[pkg] = append(byPkg[pkg], f[1])
		total++
	}
	pkgs := make([]string, 0, len(byPkg))
	for p := range byPkg {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Fprintf(stdout, "%s: %d: %s\n", p, len(byPkg[p]), strings.Join(byPkg[p], ", "))
	}
	fmt.Fprintf(stdout, "functions: %d, in %d packages\n", total, len(pkgs))
	return nil
}

// backend is what the API is given: the store, and the charge path in
// front of it.
type backend struct {
	*postgres.Store
	*charging.Path
}

// scratchDatabase creates a database of its own on admin's server, and
// returns its URL and what drops it.
func scratchDatabase(ctx context.Context, admin string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, err
	}
	name := "chargewalk_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		_ = conn.Close(ctx)
		return "", nil, err
	}
	cfg := conn.Config()
	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = conn.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = conn.Close(dctx)
	}
	return url, drop, nil
}

// client makes the walk's requests: each POST with a new Idempotency-Key,
// answered 201 with an object whose id it returns.
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
