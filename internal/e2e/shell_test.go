package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// sessionRoom is where the sessions run, as a reader's checkout after make
// run: bin/payments built from this checkout, bin/dev.sh (written per
// document, for a merchant of its own), and the client module with a go.work,
// so that a session may go build ./client/... as in the checkout; the real
// payments serve on a free port, on a fresh database, with an embedded NATS.
type sessionRoom struct {
	repo, dir, bin string
	databaseURL    string
	natsURL        string
	sim            *procsimtest.Sim // the card processor simulator, as make run starts it
	simSecret      string
	base           string
	log            *testkit.LogBuffer // serve's JSON lines
	db             *pgxpool.Pool      // to assert the money
}

// TestDocsShellSessions runs every sh block of README.md and docs/*.md that
// a reader pastes, each document's in order in one bash, against the real
// binary, and checks what each session did to the money (sessionChecks). The
// blocks marked as checked only are checked (checkBlock), and logged as such.
func TestDocsShellSessions(t *testing.T) {
	room := newSessionRoom(t)
	docs, err := filepath.Glob(filepath.Join(room.repo, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(room.repo, "README.md")}, docs...)
	for _, path := range docs {
		doc, _ := filepath.Rel(room.repo, path)
		t.Run(doc, func(t *testing.T) {
			blocks := shellBlocks(t, path, doc)
			var set, ran []string
			set = append(set, variablesSet(room.devScript(""))...)
			for _, b := range blocks {
				if b.check != "" {
					checkBlock(t, room.repo, b, set)
					t.Logf("%s: checked, not run: %s", b, b.check)
				} else {
					ran = append(ran, b.String())
				}
				set = append(set, variablesSet(b.text)...)
			}
			if len(ran) > 0 {
				room.runSession(t, doc, blocks)
				t.Logf("%s: ran %d blocks (%s)", doc, len(ran), strings.Join(ran, ", "))
			}
		})
	}
}

func newSessionRoom(t *testing.T) *sessionRoom {
	t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	room := &sessionRoom{repo: repo, dir: t.TempDir(), log: &testkit.LogBuffer{}}
	room.bin = filepath.Join(room.dir, "bin", "payments")
	build := exec.Command("go", "build", "-o", room.bin, "./cmd/payments")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/payments: %v\n%s", err, out)
	}
	if out, err := exec.Command("cp", "-R", filepath.Join(repo, "client"), room.dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the client module: %v\n%s", err, out)
	}
	work, err := os.ReadFile(filepath.Join(repo, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	goLine, _, _ := strings.Cut(string(work), "\n")
	writeFile(t, filepath.Join(room.dir, "go.work"), goLine+"\n\nuse ./client\n")

	room.databaseURL = pgtest.NewDatabase(t)
	room.natsURL = testkit.StartNATS(t).URL()
	addr := freeAddr(t)
	room.base = "http://" + addr
	room.simSecret = "e2e-processor-webhook-secret"
	room.sim = procsimtest.Start(t, "-webhook-url", room.base+"/v1/processor/events", "-webhook-secret", room.simSecret)
	room.db, err = pgxpool.New(context.Background(), room.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(room.db.Close)
	room.serve(t, addr)
	return room
}

// serve starts payments serve on addr as make run does (webhook endpoints on
// this machine allowed, the simulator as its card processor), and waits for
// /readyz; the test's cleanup stops it.
func (room *sessionRoom) serve(t *testing.T, addr string) {
	t.Helper()
	cmd := exec.Command(room.bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+room.databaseURL, "NATS_URL="+room.natsURL,
		"PROCESSOR_URL="+room.sim.URL(), "PROCESSOR_WEBHOOK_SECRET="+room.simSecret,
		"HTTP_ADDR="+addr, "METRICS_ADDR=127.0.0.1:0", "WEBHOOK_ALLOW_PRIVATE_NETWORKS=true",
		"SHUTDOWN_DELAY=0", "RELAY_POLL=100ms", "LOG_LEVEL=info")
	cmd.Stdout, cmd.Stderr = room.log, room.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(room.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("payments serve is not ready after 30 s:\n%s", room.log.Tail(4000))
		}
	}
}

// devScript is bin/dev.sh as make run writes it (scripts/dev.sh.tmpl) for
// the merchant whose key is apiKey.
func (room *sessionRoom) devScript(apiKey string) string {
	tmpl, err := os.ReadFile(filepath.Join(room.repo, "scripts", "dev.sh.tmpl"))
	if err != nil {
		panic(err) // the repository's own file
	}
	return strings.NewReplacer("@API_KEY@", apiKey, "@BASE@", room.base,
		"@DATABASE_URL@", room.databaseURL, "@NATS_URL@", room.natsURL,
		"@PROCESSOR_URL@", room.sim.URL(), "@PROCSIM_DATABASE_URL@", room.sim.DatabaseURL).Replace(string(tmpl))
}

// runSession runs the document's blocks that are not only checked, in order,
// in one bash with set -euo pipefail, in the room, with bin/dev.sh for a new
// merchant; then it checks the status of every request the session sent and
// what sessionChecks says the session must have left behind.
func (room *sessionRoom) runSession(t *testing.T, doc string, blocks []shellBlock) {
	t.Helper()
	check, ok := sessionChecks[doc]
	if !ok {
		t.Fatalf("%s has blocks that run, and sessionChecks says nothing of what they must leave behind: add its check", doc)
	}
	var created struct {
		MerchantID string `json:"merchant_id"`
		APIKey     string `json:"api_key"`
	}
	create := exec.Command(room.bin, "merchants", "create", "--name", "docs "+doc)
	create.Env = append(os.Environ(), "DATABASE_URL="+room.databaseURL)
	out, err := create.Output()
	if err != nil || json.Unmarshal(out, &created) != nil {
		t.Fatalf("merchants create: %v\n%s", err, out)
	}
	writeFile(t, filepath.Join(room.dir, "bin", "dev.sh"), room.devScript(created.APIKey))

	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	for _, b := range blocks {
		if b.check == "" {
			fmt.Fprintf(&script, "printf '\\n### %s\\n'\n%s", b, b.text)
		}
	}
	from := len(room.log.String())
	output := room.bash(t, script.String())
	for _, r := range testkit.JSONLog(t, room.log.String()[from:], "request") {
		if status, _ := r["status"].(float64); !slices.Contains(sessionStatuses, int(status)) {
			t.Errorf("%s: %v %v answered %v, which no session means to provoke (a placeholder left in a block?):\n%s",
				doc, r["method"], r["route"], r["status"], output)
		}
	}
	check(t, room.db, created.MerchantID, output)
}

// sessionStatuses are the answers the sessions show: successes, and the
// refusals they demonstrate. A 400, 401 or 404 means a block that does not
// work as pasted.
var sessionStatuses = []int{200, 201, 202, 204, 402, 409, 422}

// bash runs script in the room and returns what it printed; a failure fails
// the test with that output. Whatever the script left running is killed.
func (room *sessionRoom) bash(t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-c", script)
	cmd.Dir = room.dir
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"API_KEY", "BASE", "DATABASE_URL", "NATS_URL", "GOWORK"}, name)
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A process the session left running keeps the output open: stop
	// waiting for it, and kill it below.
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("the session failed (%v); it printed:\n%s\nserve's last lines:\n%s", err, out.String(), room.log.Tail(3000))
	}
	return out.String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
