package chaos_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
)

// reconcileReport is what `payments reconcile --format json` prints.
type reconcileReport struct {
	Counts     map[string]int `json:"counts"`
	Mismatches int            `json:"mismatches"`
	References []struct {
		Reference, Result, Detail string
		Ours                      *struct {
			Status         string `json:"status"`
			Amount         int64  `json:"amount"`
			AmountCaptured int64  `json:"amount_captured"`
			AmountRefunded int64  `json:"amount_refunded"`
		} `json:"ours"`
	} `json:"references"`
}

// runReconcile runs `payments reconcile` (the binary under test) over the
// scenario's window, against the simulator through the proxy the service
// reached it by (its address names the processor of every operation; the
// simulator's faults are its writes'), every operation judged (--settle
// 0s). It fails the test when the command cannot run.
func (r *procRun) runReconcile(t *testing.T) (reconcileReport, bool) {
	t.Helper()
	cmd := exec.CommandContext(r.s.ctx, r.s.bin, "reconcile", "--since", r.s.began.Add(-time.Minute).Format(time.RFC3339Nano),
		"--settle", "0s", "--format", "json")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+r.s.dbURL, "PROCESSOR_URL="+r.proxy.url(),
		"PROCESSOR_TIMEOUT="+procCallTimeout.String(), "PROCESSOR_DECISION_DEADLINE="+procDecisionDeadline.String())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && (!errors.As(err, &exit) || exit.ExitCode() != 2) {
		t.Errorf("payments reconcile: %v\n%s", err, stderr.String())
		return reconcileReport{}, false
	}
	var rep reconcileReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Errorf("payments reconcile's report: %v\n%s", err, stdout.String())
		return reconcileReport{}, false
	}
	if (rep.Mismatches > 0) != (err != nil) {
		t.Errorf("payments reconcile exited %v with %d mismatches, want 2 exactly when there are some", err, rep.Mismatches)
	}
	return rep, true
}

// reconcile holds the ledger against the processor's records once every
// charge is final: it returns how many references disagree (each a
// violation). Then it plants two faults in our tables, an approval's
// operation deleted and a captured amount lowered, and checks that a second
// run names exactly those two.
func (r *procRun) reconcile(t *testing.T) int {
	t.Helper()
	clean, ok := r.runReconcile(t)
	if !ok {
		return 0
	}
	t.Logf("payments reconcile after the faults: %v, %d mismatches", clean.Counts, clean.Mismatches)
	if clean.Counts["matched"] == 0 {
		t.Errorf("payments reconcile matched nothing: %v", clean.Counts)
	}
	var captured []string
	for _, ref := range clean.References {
		switch ref.Result {
		case "matched":
			if o := ref.Ours; o != nil && o.Status == "succeeded" && o.AmountRefunded == 0 && o.AmountCaptured == o.Amount {
				captured = append(captured, ref.Reference)
			}
		case "pending":
		default:
			t.Errorf("reconcile: %s %s: %s", ref.Reference, ref.Result, ref.Detail)
		}
	}
	if clean.Mismatches > 0 {
		return clean.Mismatches
	}
	if len(captured) < 2 {
		t.Errorf("reconcile: %d charges matched as captured in full and not refunded, want at least 2 to plant faults on", len(captured))
		return 0
	}
	deleted, lowered := captured[0], captured[1]
	id := func(ref string) any {
		u, _ := payment.ParseID(payment.PrefixCharge, ref)
		return u
	}
	_, err := r.s.db.Exec(r.s.ctx, `DELETE FROM processor_operations WHERE id = $1`, id(deleted))
	must(t, err, "delete an approval's operation")
	_, err = r.s.db.Exec(r.s.ctx, `UPDATE charges SET amount_captured = amount_captured - 100 WHERE id = $1`, id(lowered))
	must(t, err, "lower a captured amount")
	planted, ok := r.runReconcile(t)
	if !ok {
		return 0
	}
	var named []string
	for _, ref := range planted.References {
		if ref.Result != "matched" && ref.Result != "pending" {
			named = append(named, ref.Reference+" "+ref.Result)
		}
	}
	want := []string{deleted + " missing_on_our_side", lowered + " amount_mismatch"}
	slices.Sort(named)
	slices.Sort(want)
	t.Logf("payments reconcile with two faults planted: %v, naming %q", planted.Counts, named)
	if !slices.Equal(named, want) {
		t.Errorf("payments reconcile after two planted faults named %q, want %q", named, want)
	}
	return 0
}
