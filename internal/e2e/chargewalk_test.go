//go:build chargewalk

// This file is built only with -tags chargewalk, by make charge-walk and make
// lint (scripts/charge-walk.sh): it checks a block of docs/architecture.md,
// which is lint's business, and building the service with coverage takes
// longer than the rest of this package's tests; make test does not see it.

package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/internal/pgtest"
)

const (
	// walkDoc holds the walk between walkBegin and walkEnd.
	walkDoc   = "../../docs/architecture.md"
	walkBegin = "<!-- charge-walk:begin (written by make charge-walk; make lint checks it) -->"
	walkEnd   = "<!-- charge-walk:end -->"
	// walkEnv set to 1 makes the test rewrite the block instead of failing
	// when it differs (make charge-walk), as UPDATE_SCREENSHOT does for the
	// /docs screenshot.
	walkEnv    = "UPDATE_CHARGE_WALK"
	walkModule = "github.com/exactlyonce/payments/"
	// walkProgram is the walk's own code, left out of the count.
	walkProgram = "internal/e2e/testdata/chargewalk"
)

// TestChargeWalk lists the functions of this module that one fresh charge
// runs, and checks that docs/architecture.md's charge-walk block lists the
// same; with UPDATE_CHARGE_WALK=1 it rewrites the block instead.
//
// It builds testdata/chargewalk with coverage of every package of the
// module and runs it on the package's database: the program wires the
// service in process, warms it up, and three times clears the counters,
// makes one charge that succeeds, alone in its batch, with no cache hit,
// and writes the counters out (its doc comment says why it is a program). A
// function counts when its counters moved in all three walks (a charge that
// lands on a pool connection not yet warm runs that connection's warm-up
// too); a closure counts in the function that holds it.
func TestChargeWalk(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "chargewalk")
	mustRun(t, "go", "build", "-cover", "-covermode=atomic", "-coverpkg="+walkModule+"...", "-o", bin, "./testdata/chargewalk")
	out := t.TempDir()
	// GOCOVERDIR takes what the program writes at start and at exit (its
	// shutdown included); the walk is what it writes into out.
	mustRun(t, bin, "-database-url", pgtest.DatabaseURL(t), "-out", out)
	pkgs, funcs := crossed(t, filepath.Join(out, "1"))
	for _, walk := range []string{"2", "3"} {
		pkgs, funcs = common(t, pkgs, funcs, filepath.Join(out, walk))
	}
	if !slices.Contains(pkgs, "internal/charging") {
		t.Fatalf("no function of internal/charging ran:\n%s", walkTable(pkgs, funcs))
	}
	checkWalkBlock(t, walkTable(pkgs, funcs))
}

// mustRun runs a command with GOCOVERDIR set to a directory of the test's, and
// fails the test with its output if it fails.
func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Env = append(os.Environ(), "GOCOVERDIR="+t.TempDir())
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
}

// crossed returns, from `go tool covdata func` on dir, the packages of the
// module whose functions ran (sorted, relative to the module), the walk's
// own left out, and those functions in the order covdata lists them.
func crossed(t *testing.T, dir string) (pkgs []string, funcs map[string][]string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "tool", "covdata", "func", "-i="+dir).Output()
	if err != nil {
		t.Fatalf("go tool covdata func: %v", err)
	}
	funcs = map[string][]string{}
	for line := range strings.Lines(string(out)) {
		// github.com/exactlyonce/payments/internal/httpapi/handlers.go:123:	createCharge		100.0%
		f := strings.Fields(line)
		if len(f) != 3 || f[2] == "0.0%" || !strings.HasPrefix(f[0], walkModule) {
			continue
		}
		file, _, _ := strings.Cut(f[0], ":")
		if pkg := strings.TrimPrefix(filepath.Dir(file), walkModule); pkg != walkProgram {
			funcs[pkg] = append(funcs[pkg], f[1])
		}
	}
	for p := range funcs {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	return pkgs, funcs
}

// common keeps, of pkgs and funcs, the functions that the walk in dir ran
// too, in their order; a package left with none is dropped.
func common(t *testing.T, pkgs []string, funcs map[string][]string, dir string) ([]string, map[string][]string) {
	t.Helper()
	_, other := crossed(t, dir)
	kept := map[string][]string{}
	var keptPkgs []string
	for _, p := range pkgs {
		for _, f := range funcs[p] {
			if slices.Contains(other[p], f) {
				kept[p] = append(kept[p], f)
			}
		}
		if len(kept[p]) > 0 {
			keptPkgs = append(keptPkgs, p)
		}
	}
	return keptPkgs, kept
}

// walkTable renders the walk as the Markdown table of the block.
func walkTable(pkgs []string, funcs map[string][]string) string {
	var b strings.Builder
	b.WriteString("| package | functions | which |\n|---|---:|---|\n")
	total := 0
	for _, p := range pkgs {
		names := make([]string, len(funcs[p]))
		for i, f := range funcs[p] {
			names[i] = "`" + f + "`"
		}
		b.WriteString("| " + p + " | " + strconv.Itoa(len(names)) + " | " + strings.Join(names, ", ") + " |\n")
		total += len(names)
	}
	b.WriteString("| **total** | **" + strconv.Itoa(total) + "** | in " + strconv.Itoa(len(pkgs)) + " packages |\n")
	return b.String()
}

// checkWalkBlock fails the test when the block of walkDoc differs from
// table, naming the command that rewrites it; with UPDATE_CHARGE_WALK=1 it
// rewrites the block instead.
func checkWalkBlock(t *testing.T, table string) {
	t.Helper()
	raw, err := os.ReadFile(walkDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	before, rest, ok1 := strings.Cut(doc, walkBegin+"\n")
	inDoc, after, ok2 := strings.Cut(rest, walkEnd+"\n")
	if !ok1 || !ok2 {
		t.Fatalf("docs/architecture.md has no charge-walk block: put the lines\n%s\n%s\nwhere it goes, and run make charge-walk", walkBegin, walkEnd)
	}
	if inDoc == table {
		t.Logf("docs/architecture.md's charge-walk block is up to date:\n%s", table)
		return
	}
	if os.Getenv(walkEnv) != "1" {
		t.Fatalf("docs/architecture.md's charge-walk block differs from what a fresh charge runs now; make charge-walk rewrites it.\n%s",
			lineDiff(inDoc, table))
	}
	if err := os.WriteFile(walkDoc, []byte(before+walkBegin+"\n"+table+walkEnd+"\n"+after), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("docs/architecture.md: the charge-walk block rewritten:\n%s", table)
}

// lineDiff lists the lines of the block that the walk no longer gives (-)
// and those it gives instead (+).
func lineDiff(inDoc, walked string) string {
	docLines, walkLines := strings.Split(inDoc, "\n"), strings.Split(walked, "\n")
	var b strings.Builder
	for _, l := range docLines {
		if !slices.Contains(walkLines, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range walkLines {
		if !slices.Contains(docLines, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
