package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// parseFlags parses args into fs, the flags of the command fs names, whose
// synopsis is usage ("usage: payments serve [flags]"). Asked for help (-h,
// --help), it prints usage and the flags to stdout and returns flag.ErrHelp,
// which run turns into success. A setting's flag that another command takes
// is an error naming that command (foreignFlag). On another mistake the flag
// package's error and the usage go to stderr, and the error is returned.
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) error {
	var failed bytes.Buffer
	fs.SetOutput(&failed)
	fs.Usage = func() {} // printed below, where it belongs
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout, usage, fs)
		return err
	}
	if foreign := foreignFlag(fs.Name(), err); foreign != nil {
		return foreign
	}
	// A mistyped flag: the flag package's line, and where the settings are
	// listed, not the whole usage (a screenful the mistake scrolls away).
	_, _ = failed.WriteTo(stderr)
	_, _ = fmt.Fprintf(stderr, "payments %s -h lists its settings and their flags\n", fs.Name())
	return err
}

// foreignFlag turns err, the flag package's word for a flag that fs lacks,
// into an error naming the commands that take it, when it is a setting of
// some; else it returns nil. Such a flag is refused rather than ignored, as
// its variable would be: on a command line it was meant for this command.
func foreignFlag(command string, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return nil
	}
	name = strings.TrimPrefix(name, "-")
	current := name
	for renamed, former := range formerFlags {
		if former == name {
			current = renamed
		}
	}
	var takers []string
	var env string
	for _, cmd := range commands {
		if s, ok := cmd.setting(current); ok {
			takers, env = append(takers, cmd.name), s.env
		}
	}
	if len(takers) == 0 {
		return nil
	}
	return fmt.Errorf("flag --%s (%s) is a setting of payments %s, not of payments %s (\"payments %s -h\" lists its settings)",
		name, env, listed(takers), command, command)
}

// listed joins names as a sentence does: "serve", "serve and relay",
// "serve, relay and consume".
func listed(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// printUsage prints usage, then fs's own flags, then its settings room by
// room, each flag with its type (a setting's: duration, size, int, ...; else
// the one the flag package names) and its default, which for a setting is its
// variable's value when set.
func printUsage(w io.Writer, usage string, fs *flag.FlagSet) {
	fmt.Fprintln(w, usage)
	var settings []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(*settingFlag); ok {
			settings = append(settings, f)
			return
		}
		printFlag(w, f)
	})
	if len(settings) == 0 {
		return
	}
	fmt.Fprintln(w, "\nSettings, by room; each flag overrides the environment variable named at its end.")
	slices.SortFunc(settings, func(a, b *flag.Flag) int { return a.Value.(*settingFlag).order - b.Value.(*settingFlag).order })
	room := -1
	for _, f := range settings {
		if v := f.Value.(*settingFlag); v.room != room {
			room = v.room
			fmt.Fprintf(w, "\n%s:\n", v.title)
		}
		printFlag(w, f)
	}
}

// printFlag prints f: its name and type on one line, then what it means and
// its default, wrapped.
func printFlag(w io.Writer, f *flag.Flag) {
	typ, text := flag.UnquoteUsage(f)
	def := f.DefValue
	if v, ok := f.Value.(*settingFlag); ok {
		typ = v.typ
		if typ == "url" {
			def = shownURL(def)
		}
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && def == "false" {
		def = ""
	}
	if typ != "" {
		typ = " " + typ
	}
	words := strings.Fields(text)
	if def != "" {
		words = append(words, "(default "+def+")") // never broken
	}
	fmt.Fprintf(w, "  --%s%s\n", f.Name, typ)
	for _, line := range wrap(words, 72) {
		fmt.Fprintf(w, "    \t%s\n", line)
	}
}

// wrap joins words into lines of at most width bytes where it can.
func wrap(words []string, width int) []string {
	var lines []string
	line := ""
	for _, word := range words {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(lines, line)
}

// shownURL is the URL v as -h shows it, its password masked: a default taken
// from DATABASE_URL or NATS_URL may hold one. What does not parse as a URL
// (a keyword/value connection string) is not shown.
func shownURL(v string) string {
	u, err := url.Parse(v)
	if err != nil || u.Scheme == "" {
		if v == "" {
			return ""
		}
		return "(set, not shown)"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// isHelp reports whether arg asks for help, in the place of a command.
func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// settingFlag is a setting's flag. It keeps the text as given: addSettings'
// load parses every setting after the flags, so that a bad value is blamed on
// the flag or the variable it came from. typ is the type -h shows; title the
// room -h shows it under, room that room's place and order the setting's
// among those the command reads.
type settingFlag struct {
	text, typ, title string
	room, order      int
}

func (f *settingFlag) String() string { return f.text }

// Set keeps v; loadConfig parses it.
func (f *settingFlag) Set(v string) error {
	f.text = v
	return nil
}

// link is a Markdown link in a setting's doc: [text](target), the target a
// section of docs/operations.md (#anchor) or a page beside it.
var link = regexp.MustCompile(`\[([^\]]+)\]\(([^)]+)\)`)

// plainDoc is a setting's doc as -h shows it: a link as its text and where
// that is, a code span without its backquotes.
func plainDoc(doc string) string {
	doc = link.ReplaceAllStringFunc(doc, func(l string) string {
		m := link.FindStringSubmatch(l)
		if anchor, ok := strings.CutPrefix(m[2], "#"); ok && anchor != "" {
			return "docs/operations.md, " + m[1]
		}
		return "docs/" + m[2]
	})
	return strings.ReplaceAll(doc, "`", "")
}
