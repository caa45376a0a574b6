package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	digest "github.com/opencontainers/go-digest"
)

// Finding is one broken rule, at a line of the Dockerfile (0: the whole file).
type Finding struct {
	Line    int
	Rule    string
	Message string
}

// Options are what the project expects of its image.
type Options struct {
	Expose []string // ports the final stage must EXPOSE
	Ignore []string // the build context's .dockerignore patterns
}

// Lint checks the Dockerfile dt (read from name): BuildKit's build checks, then
// the project's rules:
//
//   - PinnedBaseImage: every base image (and image in COPY --from) names a tag
//     or digest, and not latest;
//   - NonRootUser: the final stage sets a USER other than root;
//   - AddURL: no ADD of a URL without --checksum (use COPY, or fetch in RUN);
//   - ExposePort: the final stage EXPOSEs each port in opt.Expose;
//   - ExecFormEntrypoint: the final stage's ENTRYPOINT is in exec (JSON) form,
//     so the process gets signals without a shell in between;
//   - CopyIgnoredFile: no COPY or ADD of a path that .dockerignore leaves out.
//
// It returns an error only when dt cannot be parsed at all.
func Lint(ctx context.Context, name string, dt []byte, opt Options) ([]Finding, error) {
	ast, err := parser.Parse(bytes.NewReader(dt))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	stages, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	findings, err := buildkitChecks(ctx, name, dt)
	if err != nil {
		return nil, err
	}
	if len(stages) == 0 {
		return append(findings, Finding{0, "NoStage", "no FROM"}), nil
	}
	findings = append(findings, pinnedBaseImages(stages)...)
	findings = append(findings, addURLs(stages)...)
	ignored, err := copyIgnored(stages, opt.Ignore)
	if err != nil {
		return nil, err
	}
	findings = append(findings, ignored...)
	findings = append(findings, finalStage(stages[len(stages)-1], opt)...)
	slices.SortStableFunc(findings, func(a, b Finding) int { return a.Line - b.Line })
	return findings, nil
}

// buildkitChecks runs BuildKit's own lint, as `docker build --check` does,
// with every base image standing in as an empty linux/amd64 image: there is no
// registry to ask, so the checks that read a base image's configuration
// (its platform, its ENV for UndefinedVar) see nothing.
func buildkitChecks(ctx context.Context, name string, dt []byte) ([]Finding, error) {
	sourceMap := llb.NewSourceMap(nil, name, "Dockerfile", dt)
	sourceMap.Definition = &llb.Definition{} // read by DockerfileLint, which never solves it
	res, err := dockerfile2llb.DockerfileLint(ctx, dt, dockerfile2llb.ConvertOpt{
		SourceMap:    sourceMap,
		MetaResolver: emptyImages{},
	})
	if err != nil {
		return nil, fmt.Errorf("buildkit lint %s: %w", name, err)
	}
	var findings []Finding
	for _, w := range res.Warnings {
		line := 0
		if w.Location != nil && len(w.Location.Ranges) > 0 {
			line = int(w.Location.Ranges[0].Start.Line)
		}
		findings = append(findings, Finding{line, w.RuleName, w.Detail})
	}
	if res.Error != nil {
		line := 0
		if len(res.Error.Location.Ranges) > 0 {
			line = int(res.Error.Location.Ranges[0].Start.Line)
		}
		findings = append(findings, Finding{line, "BuildError", res.Error.Message})
	}
	return findings, nil
}

// emptyImages resolves every image reference to an empty linux/amd64 image.
type emptyImages struct{}

func (emptyImages) ResolveImageConfig(_ context.Context, ref string, _ sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	cfg, err := json.Marshal(map[string]any{
		"os": "linux", "architecture": "amd64",
		// One layer, so that the image is not taken for scratch.
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest.FromString(ref).String()}},
	})
	return ref, "", cfg, err
}

// pinnedBaseImages reports base images without a tag or digest, or on latest.
func pinnedBaseImages(stages []instructions.Stage) []Finding {
	var findings []Finding
	seen := map[string]bool{}
	for _, s := range stages {
		base := s.BaseName
		line := lineOf(s.Location)
		switch {
		case seen[strings.ToLower(base)] || base == "scratch":
		case strings.Contains(base, "$"):
			findings = append(findings, Finding{line, "PinnedBaseImage", fmt.Sprintf("base image %q comes from a build argument; name the image and its tag", base)})
		default:
			findings = append(findings, pinned(base, line)...)
		}
		// COPY --from names an earlier stage, its index, or else an image.
		for _, c := range s.Commands {
			cp, ok := c.(*instructions.CopyCommand)
			if !ok || cp.From == "" || seen[strings.ToLower(cp.From)] || isIndex(cp.From) {
				continue
			}
			findings = append(findings, pinned(cp.From, lineOf(cp.Location()))...)
		}
		if s.Name != "" {
			seen[strings.ToLower(s.Name)] = true
		}
	}
	return findings
}

func isIndex(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func pinned(base string, line int) []Finding {
	ref, err := reference.ParseNormalizedNamed(base)
	if err != nil {
		return []Finding{{line, "PinnedBaseImage", fmt.Sprintf("image %q: %v", base, err)}}
	}
	if _, ok := ref.(reference.Digested); ok {
		return nil
	}
	tagged, ok := ref.(reference.Tagged)
	if !ok {
		return []Finding{{line, "PinnedBaseImage", fmt.Sprintf("image %q (not a stage of this file) has no tag, which means latest; name a version", base)}}
	}
	if tagged.Tag() == "latest" {
		return []Finding{{line, "PinnedBaseImage", fmt.Sprintf("image %q is on latest; name a version", base)}}
	}
	return nil
}

// addURLs reports ADD of a remote URL without --checksum.
func addURLs(stages []instructions.Stage) []Finding {
	var findings []Finding
	for _, s := range stages {
		for _, c := range s.Commands {
			add, ok := c.(*instructions.AddCommand)
			if !ok || add.Checksum != "" {
				continue
			}
			for _, src := range add.SourcePaths {
				if isURL(src) {
					findings = append(findings, Finding{lineOf(add.Location()), "AddURL",
						fmt.Sprintf("ADD %s fetches from the network unchecked; use COPY, or ADD --checksum=sha256:...", src)})
				}
			}
		}
	}
	return findings
}

func isURL(src string) bool {
	for _, p := range []string{"http://", "https://", "git@", "git://"} {
		if strings.HasPrefix(src, p) {
			return true
		}
	}
	return false
}

// copyIgnored reports COPY and ADD sources from the build context that the
// .dockerignore patterns leave out: the build would fail, or copy less.
func copyIgnored(stages []instructions.Stage, patterns []string) ([]Finding, error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	var findings []Finding
	for _, s := range stages {
		for _, c := range s.Commands {
			var sources []string
			switch c := c.(type) {
			case *instructions.CopyCommand:
				if c.From == "" {
					sources = c.SourcePaths
				}
			case *instructions.AddCommand:
				sources = c.SourcePaths
			}
			for _, src := range sources {
				clean := strings.TrimPrefix(path.Clean("/"+src), "/")
				if clean == "" || isURL(src) {
					continue
				}
				excluded, err := pm.MatchesOrParentMatches(clean)
				if err != nil {
					return nil, fmt.Errorf(".dockerignore: %w", err)
				}
				if excluded {
					findings = append(findings, Finding{lineOf(c.Location()), "CopyIgnoredFile",
						fmt.Sprintf("%s copies %s, which .dockerignore leaves out of the build context", strings.ToUpper(c.Name()), src)})
				}
			}
		}
	}
	return findings, nil
}

// finalStage checks the stage that becomes the image: its USER, EXPOSE and
// ENTRYPOINT.
func finalStage(s instructions.Stage, opt Options) []Finding {
	var (
		user       *instructions.UserCommand
		entrypoint *instructions.EntrypointCommand
		exposed    []string
		findings   []Finding
	)
	for _, c := range s.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c
		case *instructions.EntrypointCommand:
			entrypoint = c
		case *instructions.ExposeCommand:
			for _, p := range c.Ports {
				exposed = append(exposed, strings.TrimSuffix(strings.ToLower(p), "/tcp"))
			}
		}
	}
	line := lineOf(s.Location)
	switch {
	case user == nil:
		findings = append(findings, Finding{line, "NonRootUser", "the final stage sets no USER, so the container runs as root"})
	case isRoot(user.User):
		findings = append(findings, Finding{lineOf(user.Location()), "NonRootUser", fmt.Sprintf("USER %s runs the container as root", user.User)})
	}
	for _, p := range opt.Expose {
		if !slices.Contains(exposed, p) {
			findings = append(findings, Finding{line, "ExposePort", fmt.Sprintf("the final stage does not EXPOSE %s", p)})
		}
	}
	switch {
	case entrypoint == nil:
		findings = append(findings, Finding{line, "ExecFormEntrypoint", "the final stage has no ENTRYPOINT"})
	case entrypoint.PrependShell:
		findings = append(findings, Finding{lineOf(entrypoint.Location()), "ExecFormEntrypoint",
			`ENTRYPOINT in shell form runs under /bin/sh, which keeps SIGTERM from the process; use the exec form ["/path", "arg"]`})
	}
	return findings
}

func isRoot(user string) bool {
	name, _, _ := strings.Cut(user, ":")
	return name == "root" || name == "0"
}

func lineOf(loc []parser.Range) int {
	if len(loc) == 0 {
		return 0
	}
	return loc[0].Start.Line
}

// readIgnore reads a .dockerignore; a missing one means no patterns.
func readIgnore(name string) ([]string, error) {
	f, err := os.Open(name) //nolint:gosec // G304: the .dockerignore beside the Dockerfile to lint
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return patterns, nil
}
