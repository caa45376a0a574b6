package pgtest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDatabaseURLIsMigrated(t *testing.T) {
	conn := connect(t, pgtest.DatabaseURL(t))

	if name := currentDatabase(t, conn); !strings.HasPrefix(name, "payments_test_pgtest_") {
		t.Errorf("package database is %q, want a name starting payments_test_pgtest_", name)
	}
	assertMigrated(t, conn)
}

func TestNewDatabase(t *testing.T) {
	admin := connect(t, pgtest.AdminURL(t))
	pkgDB := currentDatabase(t, connect(t, pgtest.DatabaseURL(t)))

	var name string
	parent := t
	t.Run("fresh migrated database", func(t *testing.T) {
		url := pgtest.NewDatabase(t)
		conn := connect(t, url)
		name = currentDatabase(t, conn)
		if name == pkgDB {
			t.Fatalf("NewDatabase returned the package database %q", name)
		}
		assertMigrated(t, conn)

		// A change here must not show in the package database.
		if _, err := conn.Exec(t.Context(), "CREATE TABLE only_here (id int)"); err != nil {
			t.Fatal(err)
		}
		pkg := connect(t, pgtest.DatabaseURL(t))
		if tableExists(t, pkg, "only_here") {
			t.Error("a table created in the new database appears in the package database")
		}

		// Leave a connection open past this subtest's cleanup: the drop must end it.
		connect(parent, url)
	})

	if name == "" {
		t.Fatal("the subtest did not get a database")
	}
	var exists bool
	err := admin.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %q still exists after its test ended", name)
	}
}

// TestNewEmptyDatabase: a database without the service's schema, in UTF8,
// dropped when its test ends.
func TestNewEmptyDatabase(t *testing.T) {
	admin := connect(t, pgtest.AdminURL(t))
	var name string
	t.Run("empty database", func(t *testing.T) {
		conn := connect(t, pgtest.NewEmptyDatabase(t))
		name = currentDatabase(t, conn)
		if tableExists(t, conn, "schema_migrations") || tableExists(t, conn, "charges") {
			t.Error("the empty database has the service's tables")
		}
		var encoding string
		if err := conn.QueryRow(t.Context(), "SHOW server_encoding").Scan(&encoding); err != nil || encoding != "UTF8" {
			t.Errorf("server_encoding %q, %v; want UTF8", encoding, err)
		}
	})
	var exists bool
	err := admin.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil || exists || name == "" {
		t.Errorf("database %q exists %v (%v) after its test ended; want it dropped", name, exists, err)
	}
}

// TestNewDatabaseConcurrent copies the template from many tests at once, as
// parallel tests in a package do.
func TestNewDatabaseConcurrent(t *testing.T) {
	const n = 8
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	t.Run("group", func(t *testing.T) {
		for i := range n {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				conn := connect(t, pgtest.NewDatabase(t))
				assertMigrated(t, conn)
				mu.Lock()
				names[currentDatabase(t, conn)] = true
				mu.Unlock()
			})
		}
	})
	if len(names) != n {
		t.Errorf("%d parallel tests got %d distinct databases, want %d", n, len(names), n)
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func currentDatabase(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var name string
	if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func tableExists(t *testing.T, conn *pgx.Conn, table string) bool {
	t.Helper()
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", "public."+table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

func assertMigrated(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	if !tableExists(t, conn, "idempotency_keys") {
		t.Error("table idempotency_keys does not exist: the database is not migrated")
	}
}
