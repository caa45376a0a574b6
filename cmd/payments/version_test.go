package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestBuildOf: what -ldflags set wins; else the toolchain's VCS stamp; else
// the version is "(devel)" and the rest "unknown".
func TestBuildOf(t *testing.T) {
	stamped := &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201120000-74131fbc8d0e+dirty"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "74131fbc8d0e4b6a"},
		{Key: "vcs.time", Value: "2026-12-01T12:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	noVCS := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}} // go build without .git
	linked := build{Version: "v1.2.0-3-g74131fb-dirty", Commit: "74131fbc8d0e4b6a", BuildTime: "2026-12-02T08:00:00Z"}
	for _, tc := range []struct {
		name   string
		linked build
		info   *debug.BuildInfo
		want   build
	}{
		{"linked and stamped", linked, stamped, build{"v1.2.0-3-g74131fb-dirty", "74131fbc8d0e4b6a", "true", "2026-12-01T12:00:00Z", "2026-12-02T08:00:00Z", runtime.Version()}},
		{"stamped only", build{}, stamped, build{"v0.0.0-20261201120000-74131fbc8d0e+dirty", "74131fbc8d0e4b6a", "true", "2026-12-01T12:00:00Z", unknown, runtime.Version()}},
		{"linked only (docker build)", linked, noVCS, build{"v1.2.0-3-g74131fb-dirty", "74131fbc8d0e4b6a", unknown, unknown, "2026-12-02T08:00:00Z", runtime.Version()}},
		{"neither", build{}, noVCS, build{"(devel)", unknown, unknown, unknown, unknown, runtime.Version()}},
		{"no build info", build{}, nil, build{"(devel)", unknown, unknown, unknown, unknown, runtime.Version()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildOf(tc.linked, tc.info); got != tc.want {
				t.Errorf("buildOf = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// linkAs sets what -ldflags would for the rest of the test.
func linkAs(t *testing.T, v, c, at string) {
	t.Helper()
	was := []string{version, commit, buildTime}
	version, commit, buildTime = v, c, at
	t.Cleanup(func() { version, commit, buildTime = was[0], was[1], was[2] })
}

// TestVersionCommand: payments version prints the linked values, one
// "key: value" a line, or one JSON object with --json.
func TestVersionCommand(t *testing.T) {
	linkAs(t, "v1.2.0", "74131fbc8d0e4b6a", "2026-12-02T08:00:00Z")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, envOf(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{"version: v1.2.0", "commit: 74131fbc8d0e4b6a", "modified: ", "commit_time: ", "build_time: 2026-12-02T08:00:00Z", "go_version: " + runtime.Version()}
	if len(lines) != len(want) {
		t.Fatalf("payments version printed\n%s\nwant %d lines", out.String(), len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start %q", i+1, lines[i], w)
		}
	}

	out.Reset()
	if err := run(context.Background(), []string{"version", "--json"}, envOf(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var b build
	if err := json.Unmarshal(out.Bytes(), &b); err != nil || b.Version != "v1.2.0" || b.Commit != "74131fbc8d0e4b6a" ||
		b.BuildTime != "2026-12-02T08:00:00Z" || b.GoVersion != runtime.Version() {
		t.Errorf("payments version --json printed %s (%v)", out.String(), err)
	}
	if err := run(context.Background(), []string{"version", "extra"}, envOf(nil), io.Discard, io.Discard); err == nil {
		t.Error("payments version extra succeeded")
	}
}

// TestBuildInfoMetric: serve's /metrics has payments_build_info with the
// build's version, commit and Go version, as payments version prints them.
func TestBuildInfoMetric(t *testing.T) {
	linkAs(t, "v1.2.0-3-g74131fb", "74131fbc8d0e4b6a", "2026-12-02T08:00:00Z")
	env := envOf(map[string]string{"DATABASE_URL": pgtest.NewDatabase(t), "HTTP_ADDR": "127.0.0.1:0",
		"METRICS_ADDR": "127.0.0.1:0", "RELAY_ENABLED": "false", "SHUTDOWN_DELAY": "0"})
	logs := &testkit.LogBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, io.Discard, logs) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
	})
	metrics := scrape(t, waitForMetricsAddr(t, logs))
	want := `payments_build_info{commit="74131fbc8d0e4b6a",go_version="` + runtime.Version() + `",version="v1.2.0-3-g74131fb"} 1` + "\n"
	if !strings.Contains(metrics, want) || strings.Count(metrics, "payments_build_info{") != 1 {
		t.Errorf("the metrics lack %q, once:\n%s", want, metrics)
	}
}
