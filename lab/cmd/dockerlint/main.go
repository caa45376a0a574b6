// Command dockerlint checks Dockerfiles without a Docker engine or a registry:
// BuildKit's own build checks (the rules of `docker build --check`) and the
// rules this project holds its image to (see lint.go). It prints one line per
// finding and exits 1 when there is any.
//
//	go -C lab run ./cmd/dockerlint [-expose 8080] [-context DIR] ../Dockerfile
//
// (from the repository's root; make lint-docker runs it so).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "dockerlint:", err)
		os.Exit(1)
	}
}

// run lints each Dockerfile named in args; it fails when any has a finding.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dockerlint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	expose := fs.String("expose", "8080", "comma-separated ports the final stage must EXPOSE")
	buildContext := fs.String("context", "", "the build context, for its .dockerignore (default: the Dockerfile's directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: dockerlint [-expose PORTS] [-context DIR] Dockerfile")
	}
	var opt Options
	if *expose != "" {
		opt.Expose = strings.Split(*expose, ",")
	}
	failed := 0
	for _, path := range fs.Args() {
		dt, err := os.ReadFile(path) //nolint:gosec // G304: the Dockerfile named on the command line
		if err != nil {
			return err
		}
		dir := *buildContext
		if dir == "" {
			dir = filepath.Dir(path)
		}
		if opt.Ignore, err = readIgnore(filepath.Join(dir, ".dockerignore")); err != nil {
			return err
		}
		findings, err := Lint(ctx, path, dt, opt)
		if err != nil {
			return err
		}
		for _, f := range findings {
			fmt.Fprintf(stdout, "%s:%d: %s: %s\n", path, f.Line, f.Rule, f.Message)
		}
		if len(findings) == 0 {
			fmt.Fprintf(stdout, "%s: ok\n", path)
		}
		failed += len(findings)
	}
	if failed > 0 {
		return fmt.Errorf("%d finding(s)", failed)
	}
	return nil
}
