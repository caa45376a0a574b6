package charging_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// render is the charges' renderer in these tests.
var render = testkit.RenderCharge

// open opens a store at url and the charge path over it, with the defaults.
func open(t *testing.T, url string) testkit.Service {
	t.Helper()
	// Registered first, so it runs last: once the store is closed, its pool,
	// its notifier and every wait of the charge path must be gone.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	return testkit.OpenService(t, url, postgres.Options{}, charging.Options{})
}

// usdAccount inserts an account of merchant holding balance USD and returns
// its id.
func usdAccount(t *testing.T, s testkit.Service, merchant uuid.UUID, balance int64) uuid.UUID {
	t.Helper()
	id := payment.NewID()
	if _, err := s.Pool().Exec(context.Background(), `INSERT INTO accounts (merchant_id, id, currency, balance) VALUES ($1, $2, 'USD', $3)`,
		merchant, id, balance); err != nil {
		t.Fatal(err)
	}
	return id
}
