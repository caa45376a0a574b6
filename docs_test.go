package payments

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
	"unicode"
)

// The documents a reader follows links through: the front page, the history
// and the manual.
func manual(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md", "CHANGELOG.md"}, docs...)
}

// mdLink is a Markdown inline link's target: [text](target). Images too.
var mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// TestDocsLinks: every relative link of the manual names a file that exists,
// and every #anchor a heading of its file (as the code host renders it). A
// link to a web address is not followed: this machine has no internet.
func TestDocsLinks(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		anchors[path] = headingAnchors(t, path)
		return anchors[path]
	}
	for _, doc := range manual(t) {
		for n, line := range lines(t, doc) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := doc
				if file != "" {
					path = filepath.Join(filepath.Dir(doc), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s:%d: link %q: no file %s", doc, n+1, target, path)
						continue
					}
				}
				if anchor != "" && (!strings.HasSuffix(path, ".md") || !anchorsOf(path)[anchor]) {
					t.Errorf("%s:%d: link %q: %s has no heading whose anchor is #%s", doc, n+1, target, path, anchor)
				}
			}
		}
	}
}

// headingAnchors are the anchors the code host gives the headings of the
// Markdown file at path: lower case, spaces to hyphens, punctuation other
// than hyphens and underscores dropped, a repeated one numbered -1, -2, ...
// Headings inside code blocks are not headings.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range lines(t, path) {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		heading, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if inCode || !strings.HasPrefix(line, "#") || !ok {
			continue
		}
		anchor := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, heading)
		if n := seen[anchor]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", anchor, n)] = true
		} else {
			anchors[anchor] = true
		}
		seen[anchor]++
	}
	return anchors
}

// TestReadmeLayout keeps the README's layout table current: its rows name
// exactly the packages of this module that go list finds (the root package
// is the row "payments"), and each of its other rows (the client and lab
// modules, deploy/, docs/) a directory that exists.
func TestReadmeLayout(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	const module = "github.com/exactlyonce/payments"
	var packages []string
	for p := range strings.FieldsSeq(string(out)) {
		if p == module {
			p = "payments"
		}
		packages = append(packages, strings.TrimPrefix(p, module+"/"))
	}
	var rows []string
	row := regexp.MustCompile("^\\| `([^`]+)`")
	for _, line := range section(t, "README.md", "## Layout") {
		m := row.FindStringSubmatch(line)
		switch {
		case m == nil:
		case strings.HasSuffix(m[1], "/"):
			if info, err := os.Stat(m[1]); err != nil || !info.IsDir() {
				t.Errorf("README.md's layout names %s, which is not a directory", m[1])
			}
		default:
			rows = append(rows, m[1])
		}
	}
	for _, p := range packages {
		if !slices.Contains(rows, p) {
			t.Errorf("README.md's layout has no row for the package %s (go list finds it): add one", p)
		}
	}
	for _, r := range rows {
		if !slices.Contains(packages, r) {
			t.Errorf("README.md's layout has a row for %s, which go list does not find: remove or rename it", r)
		}
	}
}

// section is the lines of the Markdown file at path under heading, up to the
// next heading of the same level or higher.
func section(t *testing.T, path, heading string) []string {
	t.Helper()
	all := lines(t, path)
	start := slices.Index(all, heading)
	if start < 0 {
		t.Fatalf("%s has no line %q", path, heading)
	}
	level := strings.Index(heading, " ")
	for i := start + 1; i < len(all); i++ {
		if h := strings.Index(all[i], " "); strings.HasPrefix(all[i], "#") && h <= level && strings.Trim(all[i][:h], "#") == "" {
			return all[start+1 : i]
		}
	}
	return all[start+1:]
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var all []string
	s := bufio.NewScanner(f)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		all = append(all, s.Text())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}
