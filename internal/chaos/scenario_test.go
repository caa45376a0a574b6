package chaos_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// scenario is what every scenario stands on: a check that it leaks no
// goroutine, a context bounded by its timeout, the service binary, a
// database of its own, migrated, with its merchants registered, a pool on
// that database for the audit, and the operations driven so far (record),
// which the audit judges at the end (judge).
type scenario struct {
	ctx       context.Context
	began     time.Time
	bin       string
	dbURL     string
	merchants []merchant
	db        *pgxpool.Pool

	mu  sync.Mutex
	ops []op
}

// startScenario starts a scenario that must end within timeout, on a
// database made by newDatabase (testDatabase, or a cluster's), with a
// merchant for each name.
func startScenario(t *testing.T, timeout time.Duration, newDatabase func(*testing.T) string, names ...string) *scenario {
	t.Helper()
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	s := &scenario{ctx: ctx, began: time.Now(), bin: buildBinary(t)}
	s.dbURL = newDatabase(t)
	s.merchants = migrateAndRegister(t, s.bin, s.dbURL, names...)
	db, err := pgxpool.New(ctx, s.dbURL)
	must(t, err, "connect")
	t.Cleanup(db.Close)
	s.db = db
	return s
}

// testDatabase is a database of the test server's own (pgtest).
func testDatabase(t *testing.T) string { return pgtest.NewDatabase(t) }

// record adds o to the operations the audit judges; any goroutine may.
func (s *scenario) record(o op) {
	s.mu.Lock()
	s.ops = append(s.ops, o)
	s.mu.Unlock()
}

// recorded is the operations recorded so far.
func (s *scenario) recorded() []op {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]op(nil), s.ops...)
}

// judge stops svc once the outbox is drained and audits everything the
// scenario recorded for its first merchant (see judge in audit_test.go).
func (s *scenario) judge(t *testing.T, svc *service, natsURL string, c *client) verdict {
	t.Helper()
	return judge(t, s.ctx, s.db, svc, natsURL, s.merchants[0], c, s.recorded())
}
