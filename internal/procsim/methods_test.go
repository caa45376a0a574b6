package procsim_test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
)

// TestMethods runs each test payment method through the real process and
// counts in the audit what the simulator really did.
func TestMethods(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	cases := []struct {
		method string
		check  func(t *testing.T, s *sim, ref string)
	}{
		{"pm_card_approve", func(t *testing.T, s *sim, ref string) {
			r := s.authorize(ref, auth(ref, "pm_card_approve", 1000))
			a := decode[procsim.AuthorizeAnswer](t, r)
			if r.status != http.StatusOK || a.Result != procsim.ResultApproved || a.Status != procsim.StatusCaptured {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 1000, Captures: 1, CapturedAmount: 1000})
		}},
		{"pm_card_decline_insufficient_funds", declined("insufficient_funds")},
		{"pm_card_decline_do_not_honor", declined("do_not_honor")},
		{"pm_card_approve_lose_response", func(t *testing.T, s *sim, ref string) {
			_, err := s.do(client(5*time.Second), http.MethodPost, "/v1/authorizations", ref, auth(ref, "pm_card_approve_lose_response", 700))
			if err == nil {
				t.Fatal("the answer was not lost")
			}
			wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 700, Captures: 1, CapturedAmount: 700})
			retryApproves(t, s, ref, auth(ref, "pm_card_approve_lose_response", 700))
		}},
		{"pm_card_approve_answer_late", func(t *testing.T, s *sim, ref string) {
			_, err := s.do(client(300*time.Millisecond), http.MethodPost, "/v1/authorizations", ref, auth(ref, "pm_card_approve_answer_late", 800))
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("want a timeout, got %v", err)
			}
			wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 800, Captures: 1, CapturedAmount: 800})
			start := time.Now()
			r := s.authorize(ref, auth(ref, "pm_card_approve_answer_late", 800))
			// The late delay is 10 s (procsimtest.FastFlags): a replay plays no fault.
			if took := time.Since(start); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "true" || took >= 10*time.Second {
				t.Fatalf("a replay must not wait for the late delay: %d after %v", r.status, took)
			}
		}},
		{"pm_card_5xx_before", func(t *testing.T, s *sim, ref string) {
			for range 2 {
				if r := s.authorize(ref, auth(ref, "pm_card_5xx_before", 900)); r.status != http.StatusInternalServerError {
					t.Fatalf("got %d %s", r.status, r.body)
				}
			}
			wantAudit(t, s, ref, procsim.AuditCounts{})
		}},
		{"pm_card_5xx_after", func(t *testing.T, s *sim, ref string) {
			if r := s.authorize(ref, auth(ref, "pm_card_5xx_after", 900)); r.status != http.StatusInternalServerError {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 900, Captures: 1, CapturedAmount: 900})
			retryApproves(t, s, ref, auth(ref, "pm_card_5xx_after", 900))
		}},
		{"pm_card_slow", func(t *testing.T, s *sim, ref string) {
			start := time.Now()
			r := s.authorize(ref, auth(ref, "pm_card_slow", 100))
			if took := time.Since(start); r.status != http.StatusOK || took < 300*time.Millisecond {
				t.Fatalf("got %d after %v, want 200 after the slow delay", r.status, took)
			}
		}},
		{"pm_card_async_pending", func(t *testing.T, s *sim, ref string) {
			r := s.authorize(ref, auth(ref, "pm_card_async_pending", 100))
			if a := decode[procsim.AuthorizeAnswer](t, r); r.status != http.StatusAccepted || a.Result != procsim.ResultPending {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			eventually(t, 10*time.Second, "the async approval", func() bool { return s.audit(ref).Approvals == 1 })
			if again := s.authorize(ref, auth(ref, "pm_card_async_pending", 100)); !bytes.Equal(again.body, r.body) {
				t.Fatalf("a replay is the first answer, byte for byte: %s", again.body)
			}
		}},
		{"pm_card_reversal_refused_3", func(t *testing.T, s *sim, ref string) {
			s.authorize(ref, auth(ref, "pm_card_reversal_refused_3", 500))
			for i := range 3 {
				r := s.must(http.MethodPost, "/v1/reversals", "rev-"+ref, procsim.ReversalRequest{Reference: ref})
				if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
					t.Fatalf("reversal %d: got %d %s, want 503 with Retry-After", i+1, r.status, r.body)
				}
			}
			if r := s.must(http.MethodPost, "/v1/reversals", "rev-"+ref, procsim.ReversalRequest{Reference: ref}); r.status != http.StatusOK {
				t.Fatalf("the fourth reversal: got %d %s", r.status, r.body)
			}
			wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 500, Captures: 1, CapturedAmount: 500,
				Reversals: 1, ReversedAmount: 500, ReversalRefusals: 3})
		}},
	}
	for _, c := range cases {
		t.Run(c.method, func(t *testing.T) {
			t.Parallel()
			c.check(t, s, "ref_"+c.method)
		})
	}
	t.Run("every method has a case", func(t *testing.T) {
		for _, m := range procsim.Methods() {
			found := false
			for _, c := range cases {
				found = found || c.method == m.Name
			}
			if !found {
				t.Errorf("no case for %s", m.Name)
			}
		}
	})
}

func declined(code string) func(t *testing.T, s *sim, ref string) {
	return func(t *testing.T, s *sim, ref string) {
		req := auth(ref, "pm_card_decline_"+code, 1200)
		r := s.authorize(ref, req)
		a := decode[procsim.AuthorizeAnswer](t, r)
		if r.status != http.StatusPaymentRequired || a.Result != procsim.ResultDeclined || a.DeclineCode != code {
			t.Fatalf("got %d %s", r.status, r.body)
		}
		if again := s.authorize(ref, req); again.status != r.status || !bytes.Equal(again.body, r.body) {
			t.Fatalf("a decline is kept and replayed byte for byte: %d %s", again.status, again.body)
		}
		wantAudit(t, s, ref, procsim.AuditCounts{Declines: 1})
	}
}

// retryApproves retries req with its key and wants the one approval
// replayed, nothing more done.
func retryApproves(t *testing.T, s *sim, key string, req procsim.AuthorizeRequest) {
	t.Helper()
	r := s.authorize(key, req)
	if a := decode[procsim.AuthorizeAnswer](t, r); r.status != http.StatusOK || a.Result != procsim.ResultApproved ||
		r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a same-key retry must replay the approval: %d %s", r.status, r.body)
	}
	if got := s.audit(req.Reference).Approvals; got != 1 {
		t.Fatalf("approvals after the retry: %d, want 1", got)
	}
}

func wantAudit(t *testing.T, s *sim, ref string, want procsim.AuditCounts) {
	t.Helper()
	if got := s.audit(ref).AuditCounts; got != want {
		t.Fatalf("audit of %s:\n got %+v\nwant %+v", ref, got, want)
	}
}

// TestMethodsDocumented keeps the table of docs/processors.md equal to the
// test payment methods the simulator knows.
func TestMethodsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/processors.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(pm_[a-z0-9_]+)` \\| (.+) \\|$")
	var got []string
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		got = append(got, m[1]+": "+m[2])
	}
	sort.Strings(got)
	var want []string
	for _, m := range procsim.Methods() {
		want = append(want, m.Name+": "+m.Doc)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("docs/processors.md's methods differ from the code's:\n got %q\nwant %q", got, want)
	}
}
