package e2e_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The manual's shell blocks are the commands a reader pastes. Each document
// (README.md and docs/*.md) is a session: its ```sh blocks run in order in one
// shell. A block that needs what a test cannot have carries, on the line
// right above it, the marker
//
//	<!-- shell: check (why it is not run) -->
//
// and is only checked: its syntax (bash -n), the variables it uses (each set
// by an earlier block of the document, by bin/dev.sh, or by the shell), the
// make targets it names (make -n) and the scripts it runs (they exist).

// checkMarker is the line that makes the block below it checked, not run.
var checkMarker = regexp.MustCompile(`^<!-- shell: check \((.+)\) -->$`)

// shellBlock is one fenced sh block of a document.
type shellBlock struct {
	doc   string
	line  int    // of its opening fence, counted from 1
	text  string // its lines, each ending in a newline
	check string // why it is only checked; "" when it runs
}

func (b shellBlock) String() string { return fmt.Sprintf("%s:%d", b.doc, b.line) }

// shellBlocks reads the sh blocks of the Markdown file at path (named doc in
// messages). Fences that name another shell (bash, shell, console, zsh) are
// errors: a reader's commands are sh blocks, output is text. So is a command
// in an indented code block, which would escape this test.
func shellBlocks(t *testing.T, path, doc string) []shellBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks  []shellBlock
		current *shellBlock
		inOther bool
		prev    string
		n       int
	)
	indented := regexp.MustCompile(`^    (\$ )?(make|go|payments|bin/|\./scripts/|curl|docker|psql|kubectl|export) `)
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		n++
		switch {
		case current != nil && line == "```":
			blocks = append(blocks, *current)
			current = nil
		case current != nil:
			current.text += line + "\n"
		case inOther:
			inOther = line != "```"
		case line == "```sh":
			current = &shellBlock{doc: doc, line: n}
			if m := checkMarker.FindStringSubmatch(prev); m != nil {
				current.check = m[1]
			}
		case slices.Contains([]string{"```bash", "```shell", "```console", "```zsh"}, line):
			t.Errorf("%s:%d: a %s block: write the commands a reader pastes as ```sh (output as ```text)", doc, n, line[3:])
			inOther = true
		case strings.HasPrefix(line, "```"):
			inOther = true
		case prev == "" && indented.MatchString(line):
			t.Errorf("%s:%d: a command in an indented code block, which no test runs: make it a ```sh block", doc, n)
		case checkMarker.MatchString(prev):
			t.Errorf("%s:%d: a shell-check marker not followed by a ```sh block", doc, n-1)
		}
		prev = line
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if current != nil {
		t.Errorf("%s: the sh block of line %d never ends", doc, current.line)
	}
	return blocks
}

// shellVariable is a variable expansion: $NAME or ${NAME...}.
var shellVariable = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

// shellAssignments set a name: NAME= (after export or local too), for NAME
// in, read NAME, and a function's definition NAME() {.
var shellAssignments = []*regexp.Regexp{
	regexp.MustCompile(`(?:^|[\s;(&|])(?:export\s+|local\s+)?([A-Za-z_]\w*)=`),
	regexp.MustCompile(`\bfor\s+([A-Za-z_]\w*)\s+in\b`),
	regexp.MustCompile(`\bread\s+(?:-r\s+)?([A-Za-z_]\w*)`),
	regexp.MustCompile(`(?m)(?:^|[\s;])([A-Za-z_]\w*)\(\)\s*\{`),
}

// unquoted is text with its single-quoted strings and its comments removed:
// what the shell would expand.
func unquoted(text string) string {
	text = regexp.MustCompile(`'[^']*'`).ReplaceAllString(text, "''")
	return regexp.MustCompile(`(?m)(^|\s)#.*$`).ReplaceAllString(text, "$1")
}

// variablesSet are the names text assigns (or defines as functions).
func variablesSet(text string) []string {
	var names []string
	for _, re := range shellAssignments {
		for _, m := range re.FindAllStringSubmatch(unquoted(text), -1) {
			names = append(names, m[1])
		}
	}
	return names
}

// shellEnvironment is what the shell and a login give every session.
var shellEnvironment = []string{"HOME", "PATH", "PWD", "OLDPWD", "USER", "SHELL", "TMPDIR", "RANDOM", "BASH_SOURCE"}

// checkBlock checks a block that is not run: its syntax, that each variable
// it expands is set (by set, or earlier in the block), that each make target
// it names exists and that each script it runs is there.
func checkBlock(t *testing.T, repo string, b shellBlock, set []string) {
	t.Helper()
	if out, err := exec.Command("bash", "-n", "-c", b.text).CombinedOutput(); err != nil {
		t.Errorf("%s: bash -n: %v\n%s", b, err, out)
	}
	set = slices.Concat(set, variablesSet(b.text), shellEnvironment)
	for _, m := range shellVariable.FindAllStringSubmatch(unquoted(b.text), -1) {
		if !slices.Contains(set, m[1]) {
			t.Errorf("%s: $%s is set by no earlier block of %s, nor by bin/dev.sh: a reader pasting it gets an empty string", b, m[1], b.doc)
		}
	}
	makeLine := regexp.MustCompile(`(?m)^(?:[A-Z_]+=\S*\s+)*make\s+([^#\n]*)`)
	for _, m := range makeLine.FindAllStringSubmatch(b.text, -1) {
		var targets []string
		for _, w := range strings.Fields(m[1]) {
			if strings.ContainsAny(w, "|;&<>()") {
				break // the command ends here: a pipe, a redirection, ...
			}
			if !strings.HasPrefix(w, "-") && !strings.Contains(w, "=") {
				targets = append(targets, w)
			}
		}
		cmd := exec.Command("make", append([]string{"-n", "-C", repo}, targets...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: make %s: no such target, or it does not expand (make -n: %v)\n%s", b, strings.Join(targets, " "), err, out)
		}
	}
	for _, m := range regexp.MustCompile(`\./(scripts/[\w.-]+)`).FindAllStringSubmatch(b.text, -1) {
		if info, err := os.Stat(filepath.Join(repo, m[1])); err != nil || info.Mode()&0o111 == 0 {
			t.Errorf("%s: runs ./%s, which is not an executable file of the repository", b, m[1])
		}
	}
}
