package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Set at link time by make build and the Dockerfile's build:
//
//	go build -ldflags "-X main.version=v1.2.0 -X main.commit=<sha> -X main.buildTime=<RFC 3339>"
//
// A value set wins over what the Go toolchain stamped into the binary, which
// a build without .git (the Dockerfile's) lacks.
var version, commit, buildTime string

// build says which build of payments runs: what `payments version` prints
// and payments_build_info's labels.
type build struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	Modified   string `json:"modified"` // whether the work tree differed from Commit: true, false or unknown
	CommitTime string `json:"commit_time"`
	BuildTime  string `json:"build_time"`
	GoVersion  string `json:"go_version"`
}

// unknown stands for what neither -ldflags nor the toolchain's stamp says.
const unknown = "unknown"

// currentBuild is this binary's build.
func currentBuild() build {
	info, _ := debug.ReadBuildInfo()
	return buildOf(build{Version: version, Commit: commit, BuildTime: buildTime}, info)
}

// buildOf combines what -ldflags set (linked: Version, Commit, BuildTime; ""
// when not set) with what the toolchain stamped (info, nil when none):
// linked values win. go build stamps the module's version, or "(devel)", and
// the commit, its time and whether the work tree was modified when it
// builds from a VCS checkout; the build time only -ldflags gives.
func buildOf(linked build, info *debug.BuildInfo) build {
	b := build{Version: "(devel)", Commit: unknown, Modified: unknown, CommitTime: unknown, BuildTime: unknown, GoVersion: runtime.Version()}
	if info != nil {
		if info.Main.Version != "" {
			b.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.time":
				b.CommitTime = s.Value
			case "vcs.modified":
				b.Modified = s.Value
			}
		}
	}
	for _, v := range []struct{ linked, into *string }{
		{&linked.Version, &b.Version}, {&linked.Commit, &b.Commit}, {&linked.BuildTime, &b.BuildTime},
	} {
		if *v.linked != "" {
			*v.into = *v.linked
		}
	}
	return b
}

// printVersion prints the build, one "key: value" a line, or as JSON.
func printVersion(_ context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args, "usage: payments version [--json]", stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected argument %q", fs.Arg(0))
	}
	b := currentBuild()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(b)
	}
	_, err := fmt.Fprintf(stdout, "version: %s\ncommit: %s\nmodified: %s\ncommit_time: %s\nbuild_time: %s\ngo_version: %s\n",
		b.Version, b.Commit, b.Modified, b.CommitTime, b.BuildTime, b.GoVersion)
	return err
}
