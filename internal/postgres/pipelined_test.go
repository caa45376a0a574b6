package postgres_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestPipelinedTransactionIsWholeOrNothing: a transaction sent in one round
// trip commits every statement, or, when one fails, none: the statements
// before it are rolled back, those after it never run, and the connection
// goes back to the pool usable.
func TestPipelinedTransactionIsWholeOrNothing(t *testing.T) {
	t.Parallel()
	s := open(t, pgtest.DatabaseURL(t))
	ctx := t.Context()
	table := "pipelined_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	if _, err := s.Pool().Exec(ctx, `CREATE TABLE `+table+` (n int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.Pool().Exec(ctx, `DROP TABLE `+table) })
	count := func() (n int) {
		t.Helper()
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := s.Pipelined(ctx, `INSERT INTO `+table+` VALUES (1)`, `INSERT INTO `+table+` VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d rows after a committed pipeline, want 2", n)
	}
	// The second statement fails (a duplicate): the first is rolled back,
	// the third never runs.
	err := s.Pipelined(ctx, `INSERT INTO `+table+` VALUES (3)`, `INSERT INTO `+table+` VALUES (1)`, `INSERT INTO `+table+` VALUES (4)`)
	if err == nil {
		t.Fatal("a pipeline with a failing statement reported no error")
	}
	if n := count(); n != 2 {
		t.Errorf("%d rows after a failed pipeline, want the 2 from before", n)
	}
	// Every connection of the pool is usable: none was left in a
	// transaction.
	for range s.Pool().Stat().MaxConns() {
		if err := s.Pipelined(ctx, `SELECT 1`); err != nil {
			t.Fatalf("a pipeline after the failed one: %v", err)
		}
	}
	if n := count(); n != 2 {
		t.Errorf("%d rows at the end, want 2", n)
	}
}
