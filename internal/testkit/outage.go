package testkit

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// DatabaseSwitch cuts a test's database off and lets it back, as an outage
// would, with no proxy in front of it: Cut refuses new connections to the
// database (ALLOW_CONNECTIONS false, which holds for every role) and ends the
// open ones; Restore lets connections in again. The test's cleanup restores
// it.
type DatabaseSwitch struct {
	t     testing.TB
	admin *pgx.Conn
	name  string
}

// NewDatabaseSwitch returns the switch of the database databaseURL names,
// worked through adminURL (pgtest.AdminURL), another database on its server.
func NewDatabaseSwitch(t testing.TB, adminURL, databaseURL string) *DatabaseSwitch {
	t.Helper()
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	s := &DatabaseSwitch{t: t, admin: Connect(t, adminURL), name: cfg.Database}
	t.Cleanup(s.Restore)
	return s
}

// Cut refuses new connections to the database and ends those open.
func (s *DatabaseSwitch) Cut() {
	s.t.Helper()
	s.exec(`ALTER DATABASE ` + pgx.Identifier{s.name}.Sanitize() + ` ALLOW_CONNECTIONS false`)
	s.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, s.name)
}

// Restore lets connections to the database in again.
func (s *DatabaseSwitch) Restore() {
	s.t.Helper()
	s.exec(`ALTER DATABASE ` + pgx.Identifier{s.name}.Sanitize() + ` ALLOW_CONNECTIONS true`)
}

func (s *DatabaseSwitch) exec(sql string, args ...any) {
	s.t.Helper()
	if _, err := s.admin.Exec(context.Background(), sql, args...); err != nil {
		s.t.Fatalf("database switch: %s: %v", sql, err)
	}
}

// LogLine is one line of a JSON log (log/slog's JSONHandler), by attribute.
type LogLine map[string]any

// JSONLog parses the lines of a JSON log whose message is msg, or every line
// when msg is empty. A line that is not JSON fails the test.
func JSONLog(t testing.TB, log, msg string) []LogLine {
	t.Helper()
	var out []LogLine
	for _, s := range strings.Split(log, "\n") {
		if s == "" {
			continue
		}
		var ln LogLine
		if err := json.Unmarshal([]byte(s), &ln); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		if msg == "" || ln["msg"] == msg {
			out = append(out, ln)
		}
	}
	return out
}

// Where keeps the lines whose attribute key has one of values.
func Where(lines []LogLine, key string, values ...string) []LogLine {
	var out []LogLine
	for _, ln := range lines {
		for _, v := range values {
			if ln[key] == v {
				out = append(out, ln)
				break
			}
		}
	}
	return out
}
