package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
)

// parseFlags parses args into fs, the flags of a command whose synopsis is
// usage ("usage: payments serve [flags]"). Asked for help (-h, --help), it
// prints usage and the flags to stdout and returns flag.ErrHelp, which run
// turns into success. On a mistake the flag package has printed the error to
// stderr; the usage follows it there, and the error is returned.
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) error {
	fs.SetOutput(stderr)
	fs.Usage = func() {} // printed below, where it belongs
	err := fs.Parse(args)
	if err == nil {
		return nil
	}
	out := stderr
	if errors.Is(err, flag.ErrHelp) {
		out = stdout
	}
	printUsage(out, usage, fs)
	return err
}

// printUsage prints usage, then fs's flags, each with its type (a setting's:
// duration, size, int, ...; else the one the flag package names) and its
// default, which for a setting is its variable's value when set.
func printUsage(w io.Writer, usage string, fs *flag.FlagSet) {
	fmt.Fprintln(w, usage)
	fs.VisitAll(func(f *flag.Flag) {
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
		fmt.Fprintf(w, "  --%s%s\n    \t%s", f.Name, typ, text)
		if def != "" {
			fmt.Fprintf(w, " (default %s)", def)
		}
		fmt.Fprintln(w)
	})
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

// settingFlag is a setting's flag. It keeps the text as given: loadConfig
// parses every setting after the flags, so that a bad value is blamed on the
// flag or the variable it came from. typ is the type -h shows.
type settingFlag struct{ text, typ string }

func (f *settingFlag) String() string { return f.text }

// Set keeps v; loadConfig parses it.
func (f *settingFlag) Set(v string) error {
	f.text = v
	return nil
}
