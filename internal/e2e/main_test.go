package e2e_test

import (
	"testing"

	"github.com/exactlyonce/payments/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
