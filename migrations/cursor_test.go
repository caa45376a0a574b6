package migrations_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/migrations"
)

// TestCursorStartsBeforeTheFirstUnpublishedEvent migrates a database whose
// events were marked one by one (published_at, migrations 0002 to 0007) to
// the relay's cursor (0008): the cursor starts at the last published event
// below the first unpublished one, so nothing unpublished is skipped, and an
// event marked above a gap is published again rather than lost. Migrating
// back marks exactly the events at or before the cursor.
func TestCursorStartsBeforeTheFirstUnpublishedEvent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		published []int // which of events 1..6 (in feed order) were marked
		cursor    int   // the event the cursor must start at, 0 for none
	}{
		{"a prefix", []int{1, 2, 3, 4}, 4},
		{"all", []int{1, 2, 3, 4, 5, 6}, 6},
		{"a gap", []int{1, 2, 4, 5}, 2},
		{"none", nil, 0},
		{"the first unpublished only", []int{2, 3}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dbURL := emptyDatabase(t)
			if err := migrations.UpFrom(dbURL, migrationsBefore(t, 8)); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(t.Context(), dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(t.Context())
			exec := func(sql string, args ...any) {
				t.Helper()
				if _, err := conn.Exec(t.Context(), sql, args...); err != nil {
					t.Fatal(err)
				}
			}
			// Six events, each in a transaction of its own; event i has seq i.
			for range 6 {
				exec(`INSERT INTO events (merchant_id, id, aggregate_type, aggregate_id, type, payload)
VALUES (gen_random_uuid(), gen_random_uuid(), 'charge', gen_random_uuid(), 'charge.succeeded', '{}')`)
			}
			exec(`UPDATE events SET published_at = now() WHERE seq = ANY($1)`, tc.published)

			if err := migrations.UpFrom(dbURL, migrationsBefore(t, 9)); err != nil {
				t.Fatal(err)
			}
			var seq int
			if err := conn.QueryRow(t.Context(), `
SELECT coalesce((SELECT e.seq FROM events e JOIN outbox_cursor c ON (e.tx_id, e.seq) = (c.tx_id, c.seq)), 0)
FROM outbox_cursor WHERE stream = 'relay'`).Scan(&seq); err != nil {
				t.Fatal(err)
			}
			if seq != tc.cursor {
				t.Errorf("the cursor starts at event %d, want %d", seq, tc.cursor)
			}
			unpublished := readSeqs(t, conn, `SELECT seq FROM unpublished_events ORDER BY tx_id, seq`)
			if want := []int{1, 2, 3, 4, 5, 6}[tc.cursor:]; !slices.Equal(unpublished, want) {
				t.Errorf("unpublished_events: %v, want %v", unpublished, want)
			}

			if err := migrations.Down(dbURL); err != nil {
				t.Fatal(err)
			}
			marked := readSeqs(t, conn, `SELECT seq FROM events WHERE published_at IS NOT NULL ORDER BY seq`)
			if want := []int{1, 2, 3, 4, 5, 6}[:tc.cursor]; !slices.Equal(marked, want) {
				t.Errorf("after migrating back, marked published: %v, want %v", marked, want)
			}
		})
	}
}

// migrationsBefore returns this directory's migrations numbered below n.
func migrationsBefore(t *testing.T, n int) fstest.MapFS {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sql") || name >= fmt.Sprintf("%04d", n) {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fsys[name] = &fstest.MapFile{Data: b}
	}
	return fsys
}

func readSeqs(t *testing.T, conn *pgx.Conn, sql string) []int {
	t.Helper()
	rows, err := conn.Query(t.Context(), sql)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return seqs
}
