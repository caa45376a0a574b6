package idempotency

import (
	"testing"

	"go.uber.org/goleak"
)

// The coalescer and the janitor run goroutines: none may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
