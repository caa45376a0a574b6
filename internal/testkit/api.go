package testkit

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/postgres"
)

// APIOptions shape StartAPI's service. Zero values take the defaults.
type APIOptions struct {
	// MaxConns and KeyWait are the store's (postgres.Options; KeyWait
	// default 5 s, also the coalescer's wait).
	MaxConns int32
	KeyWait  time.Duration
	// CacheSize bounds the cache of completed responses (0: no cache).
	CacheSize int
	// Spec is served at /openapi.yaml (default a stub document); Docs
	// serves /docs as well.
	Spec []byte
	Docs bool
	// KeyBudget is the store's budget of unknown API keys (zero fields:
	// the defaults); TrustedProxies the API's.
	KeyBudget      postgres.KeyBudget
	TrustedProxies []netip.Prefix
	// AuthorizationTTL is the charge path's (zero: its default).
	AuthorizationTTL time.Duration
	// AllowPrivateNetworks is the API's WEBHOOK_ALLOW_PRIVATE_NETWORKS: set
	// it only in a test whose webhook endpoints are local receivers.
	AllowPrivateNetworks bool
	// Cards, if set, are the options of card charges (with their
	// Processor), rendered as the API renders them; their recovery runs
	// until the test ends. Without it card charges are refused.
	Cards *cards.Options
	// Budget is the API's per-merchant budget (zero: no limit).
	Budget httpapi.MerchantBudget
}

// API is the service in process, as cmd/payments serve wires it, on a
// test's database, with a merchant of the test's own, so that tests sharing
// a database never see each other's money.
type API struct {
	URL     string
	Service Service            // the store and the charge path
	DB      *pgxpool.Pool      // to assert the money straight from the tables
	Logs    *LogBuffer         // the service's log, as JSON lines
	Front   *idempotency.Front // the server's; its cache counts hits
	Metrics *metrics.Metrics   // the server's
	Cards   *cards.Cards       // card charges, with APIOptions.Cards

	MerchantID uuid.UUID
	APIKey     string
}

// StartAPI starts the API on the database at url behind an httptest server,
// and registers a merchant named after the test; all of it stops when t
// ends.
func StartAPI(t testing.TB, url string, opts APIOptions) *API {
	t.Helper()
	if opts.KeyWait == 0 {
		opts.KeyWait = 5 * time.Second
	}
	if opts.Spec == nil {
		opts.Spec = []byte("openapi: 3.1.0\n")
	}
	ctx := context.Background()
	svc := OpenService(t, url, postgres.Options{MaxConns: opts.MaxConns, KeyWait: opts.KeyWait, KeyBudget: opts.KeyBudget}, charging.Options{AuthorizationTTL: opts.AuthorizationTTL})
	// One connection opened now, with no bound: a short KeyWait also bounds
	// the wait for a pooled connection, and opening the first one on a loaded
	// machine (a container's network, packages in parallel) can take longer
	// than the few hundred milliseconds a test gives it.
	if err := svc.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	a := &API{
		Service: svc,
		DB:      db,
		Logs:    &LogBuffer{},
		Front:   idempotency.NewFront(opts.CacheSize, 64<<20, 24*time.Hour, opts.KeyWait),
		Metrics: metrics.New(),
	}
	log := slog.New(slog.NewJSONHandler(a.Logs, nil))
	apiOpts := httpapi.Options{
		Spec: opts.Spec, Docs: opts.Docs, Front: a.Front, Metrics: a.Metrics, TrustedProxies: opts.TrustedProxies,
		AllowPrivateNetworks: opts.AllowPrivateNetworks, Budget: opts.Budget,
	}
	if opts.Cards != nil {
		a.Cards = startCards(t, svc.Store, *opts.Cards, log)
		apiOpts.Cards = a.Cards
	}
	srv := httptest.NewServer(httpapi.New(svc, log, apiOpts))
	t.Cleanup(srv.Close)
	a.URL = srv.URL
	merchant, key, err := svc.RegisterMerchant(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	a.MerchantID, a.APIKey = merchant, key.Secret
	return a
}

// startCards starts card charges on s and their recovery, stopped when t
// ends (before the server closes), once the calls under way have ended.
func startCards(t testing.TB, s *postgres.Store, o cards.Options, log *slog.Logger) *cards.Cards {
	o.Render, o.RenderOperation = httpapi.RenderCardCharge, httpapi.RenderCardOperation
	if o.Log == nil {
		o.Log = log
	}
	c := cards.New(s.Cards, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		c.Wait()
	})
	return c
}
