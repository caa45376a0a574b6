package charging_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/exactlyonce/payments/internal/charging"
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
