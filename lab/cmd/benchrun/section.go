package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
)

// replaceMarkedSection is report with section (from its line begin to its
// line end, each line ending in a newline) in place of the lines from begin
// to end it held. Without them, section goes before the line before when
// report has it, else at the end, after a newline when report is not empty.
func replaceMarkedSection(report, begin, end, before, section string) string {
	lines := strings.Split(strings.TrimSuffix(report, "\n"), "\n")
	if report == "" {
		return section
	}
	var b strings.Builder
	switch {
	case slices.Contains(lines, begin):
		skip := false
		for _, line := range lines {
			switch {
			case line == begin:
				b.WriteString(section)
				skip = true
			case line == end:
				skip = false
			case !skip:
				b.WriteString(line + "\n")
			}
		}
	case before != "" && slices.Contains(lines, before):
		for _, line := range lines {
			if line == before {
				b.WriteString(section + "\n")
			}
			b.WriteString(line + "\n")
		}
	default:
		return report + "\n" + section
	}
	return b.String()
}

// refreshContents rewrites the report's list of contents (the first run of
// lines "- [title](#anchor)", as withContents made it) from the sections
// (## headings) after it, so that a section written apart is listed.
// Without such a list, report is returned as it is.
func refreshContents(report string) string {
	lines := strings.SplitAfter(report, "\n")
	first := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "- [") })
	if first < 0 {
		return report
	}
	last := first
	for last < len(lines) && strings.HasPrefix(lines[last], "- [") {
		last++
	}
	var list strings.Builder
	fenced := false
	for _, line := range lines[last:] {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if title, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "## "); ok && !fenced {
			fmt.Fprintf(&list, "- [%s](#%s)\n", title, anchor(title))
		}
	}
	return strings.Join(lines[:first], "") + list.String() + strings.Join(lines[last:], "")
}

// writeMarkedSection replaces the section between begin and end in the
// file at path (see replaceMarkedSection) and refreshes its contents; the
// file is created when it does not exist.
func writeMarkedSection(path, begin, end, before, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	text := refreshContents(replaceMarkedSection(string(old), begin, end, before, section))
	return os.WriteFile(path, []byte(text), 0o644) //nolint:gosec // G703: BENCH_REPORT, the file its operator names
}
