package e2e_test

import (
	"testing"

	"payments/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
