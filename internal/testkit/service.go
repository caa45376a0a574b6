package testkit

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/postgres"
)

// Service is the service's backend as cmd/payments wires it: the store, and
// in front of it the keyed writes on the ledger (Idempotent) and the charge
// use case (CreateCharge, Ready, Stats). It is an httpapi.Backend.
type Service struct {
	*postgres.Store
	*idempotency.Keys[payment.Ledger]
	*charging.Path
}

// OpenService opens a store at url with opts, closed when t ends, and the
// charge path over it with charge. The charge path's bounds the store also
// has (KeyWait, CommitWait, and Waiters, half the pool) default to the
// store's, as cmd/payments sets them.
func OpenService(t testing.TB, url string, opts postgres.Options, charge charging.Options) Service {
	t.Helper()
	s, err := postgres.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return NewService(s, opts, charge)
}

// NewService is OpenService for a store s already open with opts.
func NewService(s *postgres.Store, opts postgres.Options, charge charging.Options) Service {
	if charge.KeyWait == 0 {
		charge.KeyWait = opts.KeyWait
	}
	if charge.CommitWait == 0 {
		charge.CommitWait = opts.CommitWait
	}
	if charge.Waiters == 0 && opts.MaxConns > 0 {
		charge.Waiters = max(1, int(opts.MaxConns)/2)
	}
	keys := idempotency.NewKeys(s.Keys, idempotency.KeysOptions{TTL: opts.KeyTTL})
	return Service{Store: s, Keys: keys, Path: charging.New(s, charge)}
}

// RenderCharge is an chargedb.Renderer as simple as the API's: 201
// with the charge, 402 for a failed one, 404 and 422 for a refusal.
func RenderCharge(c payment.Charge, body []byte, err error) (idempotency.Response, error) {
	switch {
	case errors.Is(err, payment.ErrAccountNotFound):
		return idempotency.Response{Status: http.StatusNotFound, Body: []byte(`"no account"`)}, nil
	case errors.Is(err, payment.ErrCurrencyMismatch):
		return idempotency.Response{Status: http.StatusUnprocessableEntity, Body: []byte(`"currency"`)}, nil
	case err != nil:
		return idempotency.Response{}, err
	case c.Status == payment.ChargeFailed:
		return idempotency.Response{Status: http.StatusPaymentRequired, Body: []byte(`"` + c.ID.String() + `"`)}, nil
	}
	return idempotency.Response{Status: http.StatusCreated, Body: body}, nil
}

// Connect opens a connection to url of the test's own, closed when it ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// Execute runs step under req's key through the service's keyed writes, as
// the API's handlers do, step's response stored with the key.
func (s Service) Execute(ctx context.Context, req idempotency.Request,
	step func(context.Context, payment.Ledger) (idempotency.Response, error)) (idempotency.Result, error) {
	return s.Idempotent(ctx, req, idempotency.Respond(step))
}

// Execute is Service.Execute on a bare store, its keys kept for the default
// retention.
func Execute(ctx context.Context, s *postgres.Store, req idempotency.Request,
	step func(context.Context, payment.Ledger) (idempotency.Response, error)) (idempotency.Result, error) {
	return idempotency.NewKeys(s.Keys, idempotency.KeysOptions{}).Idempotent(ctx, req, idempotency.Respond(step))
}
