package procsim_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
)

// TestRandomFaults: under seeded random faults (answers dropped, 500s before
// and after processing, delays) a caller that retries with its key until it
// gets an answer makes exactly one approval per reference.
func TestRandomFaults(t *testing.T) {
	t.Parallel()
	s := startSim(t, "-fault-rate", "0.5", "-fault-seed", "7", "-slow-delay", "100ms")
	const n = 30
	c := client(5 * time.Second)
	failures := 0
	for i := range n {
		ref := fmt.Sprintf("ref_fault_%d", i)
		for attempt := 0; ; attempt++ {
			if attempt == 50 {
				t.Fatalf("%s: no answer after 50 attempts", ref)
			}
			r, err := s.do(c, http.MethodPost, "/v1/authorizations", ref, auth(ref, "pm_card_approve", 100))
			if err == nil && r.status == http.StatusOK {
				break
			}
			failures++
		}
	}
	if failures == 0 {
		t.Fatal("no fault was injected")
	}
	for i := range n {
		ref := fmt.Sprintf("ref_fault_%d", i)
		wantAudit(t, s, ref, procsim.AuditCounts{Approvals: 1, ApprovedAmount: 100, Captures: 1, CapturedAmount: 100})
	}
	t.Logf("%d requests failed and were retried", failures)
}
