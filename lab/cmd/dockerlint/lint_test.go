package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
)

// good is the shape of the project's Dockerfile; each case below breaks it in
// one place.
const good = `# syntax=docker/dockerfile:1
FROM golang:1.26 AS build
WORKDIR /src
COPY . .
RUN CGO_ENABLED=0 go build -o /out/payments ./cmd/payments

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/payments /usr/local/bin/payments
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/payments"]
CMD ["serve"]
`

func TestLint(t *testing.T) {
	opt := Options{Expose: []string{"8080"}, Ignore: []string{".git", "bin/"}}
	cases := []struct {
		name, old, new string
		want           []string // rules, in order of lines
	}{
		{"good", "", "", nil},
		{"untagged base", "FROM golang:1.26 AS build", "FROM golang AS build", []string{"PinnedBaseImage"}},
		{"latest base", "FROM golang:1.26 AS build", "FROM golang:latest AS build", []string{"PinnedBaseImage"}},
		{"digest is pinned", "static-debian12:nonroot", "static-debian12@sha256:" + strings.Repeat("a", 64), nil},
		{"base from an argument", "FROM golang:1.26 AS build", "ARG GO=golang:1.26\nFROM ${GO} AS build", []string{"PinnedBaseImage"}},
		{"no user", "USER nonroot:nonroot\n", "", []string{"NonRootUser"}},
		{"root user", "USER nonroot:nonroot", "USER 0:0", []string{"NonRootUser"}},
		{"add url", "COPY . .", "ADD https://example.com/src.tgz /src", []string{"AddURL"}},
		{"add url with checksum", "COPY . .", "ADD --checksum=sha256:" + strings.Repeat("b", 64) + " https://example.com/src.tgz /src", nil},
		{"ignored source", "COPY . .", "COPY bin/payments /src/", []string{"CopyIgnoredFile"}},
		{"other port", "EXPOSE 8080", "EXPOSE 9090", []string{"ExposePort"}},
		{"shell entrypoint", `ENTRYPOINT ["/usr/local/bin/payments"]`, "ENTRYPOINT /usr/local/bin/payments", []string{"JSONArgsRecommended", "ExecFormEntrypoint"}},
		{"no entrypoint", "ENTRYPOINT [\"/usr/local/bin/payments\"]\n", "", []string{"ExecFormEntrypoint"}},
		{"buildkit: casing", "FROM golang:1.26 AS build", "FROM golang:1.26 as build", []string{"FromAsCasing"}},
		{"copy from a misspelt stage", "COPY --from=build", "COPY --from=biuld", []string{"PinnedBaseImage"}},
		{"copy from a stage index", "COPY --from=build", "COPY --from=0", nil},
		{"buildkit: duplicate stage", "FROM gcr.io/distroless/static-debian12:nonroot", "FROM gcr.io/distroless/static-debian12:nonroot AS build", []string{"DuplicateStageName", "BuildError"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			df := strings.Replace(good, tc.old, tc.new, 1)
			if tc.old != "" && df == good {
				t.Fatalf("%q is not in the Dockerfile", tc.old)
			}
			findings, err := Lint(context.Background(), "Dockerfile", []byte(df), opt)
			if err != nil {
				t.Fatal(err)
			}
			var rules []string
			for _, f := range findings {
				rules = append(rules, f.Rule)
				if f.Line == 0 && f.Rule != "BuildError" {
					t.Errorf("%s has no line", f.Rule)
				}
			}
			if !slices.Equal(rules, tc.want) {
				t.Errorf("rules %v, want %v; findings: %+v", rules, tc.want, findings)
			}
		})
	}
}

func TestLintRefusesWhatDoesNotParse(t *testing.T) {
	if _, err := Lint(context.Background(), "Dockerfile", []byte("FROM golang:1.26\nNOSUCH x\n"), Options{}); err == nil {
		t.Error("an unknown instruction parsed")
	}
}

// TestProjectDockerfile: the repository's own Dockerfile and .dockerignore pass.
func TestProjectDockerfile(t *testing.T) {
	const root = "../../.." // lab/cmd/dockerlint
	if _, err := os.Stat(root + "/Dockerfile"); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if err := run(context.Background(), []string{"-context", root, root + "/Dockerfile"}, &out, &errs); err != nil {
		t.Errorf("dockerlint %s/Dockerfile: %v\n%s%s", root, err, out.String(), errs.String())
	}
}
