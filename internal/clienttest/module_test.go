package clienttest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const clientModule = "github.com/exactlyonce/payments/client"

// The oldest Go the client module says it builds with (client/go.mod); a
// consumer module on that line must be able to keep it.
const consumerGoLine = "go 1.23"

// serverDeps are modules of the server that a program importing only the
// client must not get.
var serverDeps = []string{
	"github.com/jackc/pgx", "github.com/nats-io", "github.com/testcontainers",
	"github.com/go-chi/chi", "github.com/oapi-codegen/runtime", "github.com/prometheus",
}

// TestClientModuleStandsAlone is what a program outside the repository gets
// from the client: the complete program of docs/client.md, in a scratch module that
// requires only the client module (through a replace, since nothing is
// published), keeps its go line through go mod tidy, has none of the
// server's dependencies in its module graph, builds, and charges the service
// once though it sends the charge twice.
func TestClientModuleStandsAlone(t *testing.T) {
	dir := consumerModule(t, markedBlock(t, filepath.Join(repoRoot(t), "docs", "client.md"), programMarker))
	goCmd(t, dir, "mod", "tidy")
	tidied, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^`+consumerGoLine+`$`).Match(tidied) || strings.Contains(string(tidied), "toolchain") {
		t.Errorf("go mod tidy changed the consumer's go line (want %q, no toolchain line):\n%s", consumerGoLine, tidied)
	}
	graph := goCmd(t, dir, "list", "-m", "all")
	for _, dep := range serverDeps {
		if strings.Contains(graph, dep) {
			t.Errorf("the consumer's module graph holds %s:\n%s", dep, graph)
		}
	}
	goCmd(t, dir, "build", "-o", "shop", ".")

	f := setup(t)
	run := exec.Command(filepath.Join(dir, "shop"))
	run.Env = append(os.Environ(), "PAYMENTS_URL="+f.url, "PAYMENTS_API_KEY="+f.apiKey)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the program of docs/client.md: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	m := regexp.MustCompile(`^charge (ch_[0-9a-f]{32}) succeeded replayed: (true|false)$`)
	if len(lines) != 3 || !m.MatchString(lines[0]) || !m.MatchString(lines[1]) || lines[2] != "balance 7500" {
		t.Fatalf("the program of docs/client.md printed:\n%s", out)
	}
	first, again := m.FindStringSubmatch(lines[0]), m.FindStringSubmatch(lines[1])
	if first[1] != again[1] || first[2] != "false" || again[2] != "true" {
		t.Errorf("want one charge, answered then replayed; got:\n%s", out)
	}
	if n := f.chargeRows(); n != 1 {
		t.Errorf("%d charge rows, want 1", n)
	}
	var balance int64
	if err := f.db.QueryRow(context.Background(),
		`SELECT a.balance FROM accounts a JOIN charges c ON c.account_id = a.id WHERE c.merchant_id = $1`, f.merchantID).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 7_500 {
		t.Errorf("balance %d in the ledger, want 7500", balance)
	}
}

// repoRoot is the repository's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// consumerModule writes program as main.go of a scratch module, outside the
// repository, that requires only the client module: through a replace to the
// checkout, since nothing is published. It returns the module's directory.
func consumerModule(t *testing.T, program string) string {
	t.Helper()
	dir := t.TempDir()
	goMod := fmt.Sprintf("module example.com/shop\n\n%s\n\nrequire %s v0.0.0-00010101000000-000000000000\n\nreplace %s => %s\n",
		consumerGoLine, clientModule, clientModule, filepath.Join(repoRoot(t), "client"))
	writeFile(t, filepath.Join(dir, "go.mod"), goMod)
	writeFile(t, filepath.Join(dir, "main.go"), program)
	return dir
}

// goCmd runs the go command in dir as a module outside any workspace, and
// returns its output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The lines of docs/client.md and docs/webhooks.md, HTML comments that render
// as nothing, right above the go blocks these tests build: the client's
// program and the webhook receiver.
const (
	programMarker  = "<!-- go-client-program: TestClientModuleStandsAlone (internal/clienttest) builds and runs the go block below -->"
	receiverMarker = "<!-- webhook-receiver: TestWebhookReceiverBuilds (internal/clienttest) checks the go block below is client/examples/webhookreceiver/main.go and builds it -->"
)

// TestWebhookReceiverBuilds keeps the docs' webhook receiver true: the go
// block under its marker in docs/webhooks.md is, byte for byte, the program
// client/examples/webhookreceiver that the development session builds, and
// it is a program that go vet passes and go build builds in a scratch module
// that requires only the client module. Run, it handles a delivery signed as
// the service signs it once, though the same delivery is replayed with
// another Payments-Event-Id (testReceiverDeduplicates).
func TestWebhookReceiverBuilds(t *testing.T) {
	program := markedBlock(t, filepath.Join(repoRoot(t), "docs", "webhooks.md"), receiverMarker)
	file, err := os.ReadFile(filepath.Join(repoRoot(t), "client", "examples", "webhookreceiver", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if program != string(file) {
		t.Errorf("the receiver in docs/webhooks.md differs from client/examples/webhookreceiver/main.go: copy the file into the block")
	}
	dir := consumerModule(t, program)
	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "vet", ".")
	goCmd(t, dir, "build", "-o", "receiver", ".")
	testReceiverDeduplicates(t, filepath.Join(dir, "receiver"))
}

// markedBlock is the go code block that follows the line marker in the
// Markdown file at path, directly. It fails the test if the marker is not there
// exactly once, or no go block follows it.
func markedBlock(t *testing.T, path, marker string) string {
	t.Helper()
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(readme), "\n"+marker+"\n")
	if len(parts) != 2 {
		t.Fatalf("%s holds the line %q %d times, want once: the test cannot find the block it builds", path, marker, len(parts)-1)
	}
	code, ok := strings.CutPrefix(parts[1], "```go\n")
	if !ok {
		t.Fatalf("%s: the line after %q is not a go block (```go)", path, marker)
	}
	code, _, ok = strings.Cut(code, "\n```\n")
	if !ok {
		t.Fatalf("%s: the go block after %q never ends", path, marker)
	}
	return code + "\n"
}
