package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// The configuration table of docs/operations.md is written by this test, not
// by a command of the binary: it renders the very rooms and commands that -h
// prints, from inside package main, so nothing is exported for it and nothing
// ships in the service; and a stale table fails make test as well as make
// lint (scripts/lint-settings.sh). make settings runs it with -update.
var updateSettings = flag.Bool("update-settings", false, "rewrite the configuration table of docs/operations.md from the settings")

// settingsDoc is the page that holds the table, between these markers.
const (
	settingsDoc   = "../../docs/operations.md"
	settingsBegin = "<!-- settings:begin: generated from cmd/payments/rooms.go by make settings; do not edit by hand -->"
	settingsEnd   = "<!-- settings:end -->"
)

// TestSettingsTableIsCurrent: the table between the markers is what the
// settings say, room by room: variable, flag, default, the commands that read
// it, and its meaning with its bounds.
func TestSettingsTableIsCurrent(t *testing.T) {
	page, err := os.ReadFile(settingsDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := bytes.Cut(page, []byte("<!-- settings:begin"))
	_, after, ok2 := bytes.Cut(rest, []byte(settingsEnd))
	if !ok || !ok2 {
		t.Fatalf("%s lacks the markers <!-- settings:begin...--> and %s", settingsDoc, settingsEnd)
	}
	fresh := slices.Concat(before, []byte(settingsBegin+"\n"+settingsTable()+settingsEnd), after)
	if *updateSettings {
		if err := os.WriteFile(settingsDoc, fresh, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(page, fresh) {
		t.Errorf("the configuration table of docs/operations.md differs from the settings of cmd/payments/rooms.go; run: make settings")
	}
}

// settingsTable renders every room: a line that names it and says what it
// holds, then a table of its settings.
func settingsTable() string {
	var b strings.Builder
	b.WriteString("Each command reads only the settings of its rooms: a flag of another command is an error that names it, " +
		"a variable of another command is ignored. `payments COMMAND -h` lists the same.\n")
	var c config
	for _, r := range c.rooms() {
		fmt.Fprintf(&b, "\n**%s.**", r.title)
		if r.about != "" {
			b.WriteString(" " + r.about)
		}
		b.WriteString("\n\n| variable | flag | default | read by | meaning |\n|---|---|---|---|---|\n")
		for _, s := range r.settings {
			def := "(none)"
			if s.def != "" {
				def = "`" + s.def + "`"
			}
			fmt.Fprintf(&b, "| `%s` | `--%s` %s | %s | %s | %s |\n", s.env, s.flag, s.parse.typ, def, readers(r.name, s.env),
				strings.ReplaceAll(s.doc, "|", `\|`))
		}
	}
	return b.String()
}

// readers lists the commands that read the setting env of room, a parent
// command standing for all of its own when they all read it ("migrate", not
// "migrate up", "migrate down", ...), and one that reads the variable but
// takes no flag for it said so.
func readers(room roomName, env string) string {
	var names []string
	reads := func(c command) bool { return slices.Contains(c.rooms, room) || slices.Contains(c.env, env) }
	for _, c := range commands {
		if !reads(c) {
			continue
		}
		parent, _, _ := strings.Cut(c.name, " ")
		name := "`" + c.name + "`"
		if !slices.ContainsFunc(commands, func(o command) bool { return strings.HasPrefix(o.name, parent+" ") && !reads(o) }) {
			name = "`" + parent + "`"
		}
		if !slices.Contains(c.rooms, room) {
			name += " (the variable only)"
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}

// TestSettingsTableWritesTheRoomsAndReaders pins the rendering on a few
// settings: the readers grouped by command (healthcheck's variable included),
// the flag's type, a default that is none, a room's line.
func TestSettingsTableWritesTheRoomsAndReaders(t *testing.T) {
	table := settingsTable()
	for _, want := range []string{
		"| `DATABASE_URL` | `--database-url` url | `postgres://postgres@localhost:5432/payments?sslmode=disable` | `serve`, `relay`, `consume`, `migrate`, `merchants`, `api-keys`, `charges`, `reconcile` | PostgreSQL connection URL |\n",
		"| `DB_MAX_CONNS` | `--db-max-conns` int | `20` | `serve`, `relay`, `consume`, `migrate up`, `migrate down`, `migrate force` |",
		"| `HTTP_ADDR` | `--http-addr` address | `:8080` | `serve`, `healthcheck` (the variable only) |",
		"| `PPROF_ADDR` | `--pprof-addr` address | (none) | `serve` |",
		"| `MIGRATE_WAIT` | `--migrate-wait` duration | `60s` | `migrate up` |",
		"\n**Connections and waits.** ",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
}
