package procsim_test

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

// TestOneKeyFiftyAtOnce releases 50 requests with one key together while the
// method loses the answer: the simulator approves exactly once, and every
// answer that arrives is that approval, byte for byte.
func TestOneKeyFiftyAtOnce(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	const n = 50
	ref, req := "ref_fifty", auth("ref_fifty", "pm_card_approve_lose_response", 4200)
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers [][]byte
		lost    int
	)
	for range n {
		wg.Go(func() {
			<-start
			r, err := s.do(client(10*time.Second), http.MethodPost, "/v1/authorizations", "key-fifty", req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				lost++
				return
			}
			if r.status != http.StatusOK {
				t.Errorf("got %d %s", r.status, r.body)
			}
			answers = append(answers, r.body)
		})
	}
	close(start)
	wg.Wait()
	if lost != 1 {
		t.Errorf("%d answers lost, want 1 (the one that executed)", lost)
	}
	for _, a := range answers[1:] {
		if !bytes.Equal(a, answers[0]) {
			t.Fatalf("answers differ:\n%s\n%s", a, answers[0])
		}
	}
	wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 4200, Captures: 1, CapturedAmount: 4200})
}

// TestKeyReusedWithAnotherBody refuses a known key with another body (422)
// and executes nothing.
func TestKeyReusedWithAnotherBody(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	s.authorize("key-reused", auth("ref_reused", "pm_card_approve", 100))
	r := s.authorize("key-reused", auth("ref_reused", "pm_card_approve", 101))
	if r.status != http.StatusUnprocessableEntity || decode[map[string]map[string]string](t, r)["error"]["code"] != "idempotency_key_reused" {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if r := s.authorize("", auth("ref_reused", "pm_card_approve", 100)); r.status != http.StatusBadRequest {
		t.Fatalf("no key: got %d %s", r.status, r.body)
	}
	wantAudit(t, s, "ref_reused", procsim.AuditCounts{Approvals: 1, ApprovedAmount: 100, Captures: 1, CapturedAmount: 100})
}

// TestRestart kills the process with SIGKILL and starts it again on its
// database: a key replays the same bytes, and the audit is what it was.
func TestRestart(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	req := procsim.AuthorizeRequest{Amount: 2500, Currency: "EUR", PaymentMethod: "pm_card_approve", Reference: "ref_restart", Capture: new(bool)}
	first := s.authorize("key-restart", req)
	a := decode[procsim.AuthorizeAnswer](t, first)
	s.must(http.MethodPost, "/v1/payments/"+a.PSPReference+"/captures", "cap-restart", procsim.AmountRequest{Amount: 1000})
	before := s.audit("ref_restart")

	s.Kill()
	s.Restart()

	again := s.authorize("key-restart", req)
	if again.status != first.status || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the restart the key answered %d %s, want the first answer\n%s", again.status, again.body, first.body)
	}
	after := s.audit("ref_restart")
	if after.AuditCounts != before.AuditCounts || after.Captures != 1 || after.CapturedAmount != 1000 {
		t.Fatalf("the audit changed across the restart:\n%+v\n%+v", before, after)
	}
	// The audit command reads the same database.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, procsimtest.Bin(t), "audit", "-database-url", s.DatabaseURL, "-reference", "ref_restart").Output()
	if err != nil {
		t.Fatalf("procsim audit: %v", err)
	}
	if got := decode[procsim.Audit](t, reply{body: out}); len(got.References) != 1 || got.References[0].AuditCounts != after.AuditCounts {
		t.Fatalf("procsim audit printed %s", out)
	}
}
