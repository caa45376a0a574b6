package e2e_test

import (
	"testing"

	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestMain builds the card processor simulator, which the sessions' service
// charges cards at as make run's does, and runs the tests with pgtest.
func TestMain(m *testing.M) { procsimtest.Main(m) }
