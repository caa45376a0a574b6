package benchrun

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BuildAt builds a revision from git, not the working tree, and the working
// tree when the revision is empty.
func TestBuildAt(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not on PATH")
	}
	dir := t.TempDir()
	t.Chdir(dir)
	hello := func(word string) {
		t.Helper()
		src := "package main\n\nfunc main() { println(\"" + word + "\") }\n"
		if err := os.MkdirAll("cmd/hello", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("cmd/hello/main.go", []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile("go.mod", []byte("module hello\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hello("committed")
	for _, args := range [][]string{{"init", "-q"}, {"add", "."},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "one"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	hello("uncommitted")
	ctx := context.Background()
	for rev, want := range map[string]string{"HEAD": "committed", "": "uncommitted"} {
		out := filepath.Join("bin", "hello-"+rev)
		if log, err := BuildAt(ctx, goBin, rev, "./cmd/hello", out); err != nil {
			t.Fatalf("BuildAt(%q): %v: %s", rev, err, log)
		}
		got, err := exec.Command(out).CombinedOutput()
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("the build of %q printed %q (%v), want %q", rev, got, err, want)
		}
	}
	if _, err := BuildAt(ctx, goBin, "no-such-rev", "./cmd/hello", "bin/none"); err == nil {
		t.Error("BuildAt of a revision that does not exist succeeded")
	}
}
