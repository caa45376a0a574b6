package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/procsim"
)

// The audit of TestProcessorFaults: what the simulator did (its audit,
// GET /v1/audit, one line per reference with what was done to each of its
// payments) held against what the service holds (its tables, read
// directly) and what its clients were shown.

// cardRow is a card charge in the service's tables, with its authorization
// at the processor, the keys that name it and its events.
type cardRow struct {
	id                         string // ch_…, our reference at the processor
	status                     string
	amount, captured, refunded int64
	reversalRound, attempts    int
	opState, lastCode          string
	keys                       int
	webhooks                   int         // the processor's webhooks applied to it
	events                     []cardEvent // in commit order
}

// cardEvent is an event of a card charge: its type, the status it says the
// charge entered, and its amount.
type cardEvent struct {
	typ, status string
	amount      int64
}

// simRef is what the simulator did under one reference.
type simRef struct {
	procsim.AuditCounts
	payments                int
	live                    int // payments still authorized or captured: not declined, voided, reversed or expired
	approved, cap, refunded int64
	statuses                []string
	answered                []bool // whether an answer naming each payment was delivered
}

// simAudit reads the simulator's audit, by reference.
func simAudit(t *testing.T, ctx context.Context, simURL string) map[string]*simRef {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, simURL+"/v1/audit", nil)
	must(t, err, "audit request")
	resp, err := http.DefaultClient.Do(req)
	must(t, err, "GET the simulator's audit")
	defer resp.Body.Close()
	var a procsim.Audit
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the simulator's audit: %d, %v", resp.StatusCode, err)
	}
	refs := map[string]*simRef{}
	for _, r := range a.References {
		s := &simRef{AuditCounts: r.AuditCounts, payments: len(r.Payments)}
		for _, p := range r.Payments {
			s.statuses, s.answered = append(s.statuses, p.Status), append(s.answered, p.Answered)
			if p.Status == "authorized" || p.Status == "captured" {
				s.live++
				s.approved += p.ApprovedAmount
				s.cap += p.CapturedAmount
				s.refunded += p.RefundedAmount
			}
		}
		refs[r.Reference] = s
	}
	return refs
}

// String is the evidence of a reference, for a failure's message.
func (s *simRef) String() string {
	if s == nil {
		return "nothing at the simulator"
	}
	return fmt.Sprintf("at the simulator %d payments %v (answered %v): %d approvals (%d live, approved %d, captured %d, refunded %d), "+
		"%d declines, %d voids, %d reversals, %d refused, %d expiries", s.payments, s.statuses, s.answered, s.Approvals, s.live,
		s.approved, s.cap, s.refunded, s.Declines, s.Voids, s.Reversals, s.ReversalRefusals, s.Expiries)
}

// cardRows reads the merchant's card charges, their authorizations at the
// processor, the keys naming them and their events.
func cardRows(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID) map[string]*cardRow {
	t.Helper()
	rows, err := db.Query(ctx, `
SELECT c.id, c.status, c.amount, c.amount_captured, c.amount_refunded,
       coalesce(o.reversal_round, 0), coalesce(o.attempts, 0), coalesce(o.state, ''), coalesce(o.last_code, ''),
       (SELECT count(*) FROM idempotency_keys k WHERE k.merchant_id = c.merchant_id AND k.operation_id = c.id),
       (SELECT count(*) FROM processor_events e WHERE e.merchant_id = c.merchant_id AND e.operation_id = c.id)
FROM charges c LEFT JOIN processor_operations o ON o.merchant_id = c.merchant_id AND o.id = c.id
WHERE c.merchant_id = $1 AND c.payment_method IS NOT NULL`, mid)
	must(t, err, "select card charges")
	out := map[string]*cardRow{}
	byAggregate := map[uuid.UUID]*cardRow{}
	for rows.Next() {
		var (
			r  cardRow
			id uuid.UUID
		)
		must(t, rows.Scan(&id, &r.status, &r.amount, &r.captured, &r.refunded, &r.reversalRound, &r.attempts, &r.opState, &r.lastCode, &r.keys, &r.webhooks),
			"scan card charge")
		r.id = payment.FormatID(payment.PrefixCharge, id)
		out[r.id], byAggregate[id] = &r, &r
	}
	must(t, rows.Err(), "select card charges")
	rows, err = db.Query(ctx, `SELECT aggregate_id, type, coalesce(payload->>'status', ''), coalesce((payload->>'amount')::bigint, 0)
FROM events WHERE merchant_id = $1 ORDER BY tx_id, seq`, mid)
	must(t, err, "select events")
	for rows.Next() {
		var (
			aggregate uuid.UUID
			e         cardEvent
		)
		must(t, rows.Scan(&aggregate, &e.typ, &e.status, &e.amount), "scan event")
		if r := byAggregate[aggregate]; r != nil {
			r.events = append(r.events, e)
		}
	}
	must(t, rows.Err(), "select events")
	return out
}

// cardSteps are the transitions of a card charge, by the event each writes:
// the states it may leave and the state it enters (docs/processors.md). An
// approval after a failure or a reversal is reversed (again).
var cardSteps = map[string]struct {
	from []string
	to   string
}{
	"charge.processing":      {[]string{""}, "processing"},
	"charge.succeeded":       {[]string{"processing"}, "succeeded"},
	"charge.authorized":      {[]string{"processing"}, "authorized"},
	"charge.failed":          {[]string{"processing"}, "failed"},
	"charge.reversing":       {[]string{"processing", "failed", "reversed"}, "reversing"},
	"charge.reversed":        {[]string{"reversing"}, "reversed"},
	"charge.requires_review": {[]string{"reversing"}, "requires_review"},
	"charge.captured":        {[]string{"authorized"}, "succeeded"},
	"charge.voided":          {[]string{"authorized"}, "voided"},
}

// walk replays r's events from nothing: each must be a transition from the
// state the ones before left, say the state it enters and carry the
// charge's amount, and the last must leave the charge as it is; there is a
// charge.reversing for each reversal round. It counts what broke in a and
// returns it.
func (a *cardAudit) walk(r *cardRow) []string {
	var problems []string
	state, reversings := "", 0
	for _, e := range r.events {
		step, ok := cardSteps[e.typ]
		switch {
		case !ok || e.status != step.to || e.amount != r.amount:
			a.strayEvents++
			problems = append(problems, fmt.Sprintf("stray event %s (status %q, amount %d)", e.typ, e.status, e.amount))
			continue
		case !slices.Contains(step.from, state) && step.to == state:
			a.doubledEvents++
			problems = append(problems, e.typ+" twice")
		case !slices.Contains(step.from, state):
			a.missingEvents++
			problems = append(problems, fmt.Sprintf("%s after %q: a transition between them has no event", e.typ, state))
		}
		if e.typ == "charge.reversing" {
			reversings++
		}
		state = step.to
	}
	if state != r.status {
		a.missingEvents++
		problems = append(problems, fmt.Sprintf("the events leave it %q, the charge is %s", state, r.status))
	}
	if reversings != r.reversalRound {
		a.roundsDiffer++
		problems = append(problems, fmt.Sprintf("%d charge.reversing events for %d reversal rounds", reversings, r.reversalRound))
	}
	return problems
}

// String is the evidence of a charge, for a failure's message.
func (r *cardRow) String() string {
	if r == nil {
		return "no such card charge in the service"
	}
	types := make([]string, len(r.events))
	for i, e := range r.events {
		types[i] = e.typ
	}
	return fmt.Sprintf("%s in the service (operation %s, %d checks, %d reversal rounds, last code %q, %d webhooks applied; events %v)",
		r.status, r.opState, r.attempts, r.reversalRound, r.lastCode, r.webhooks, types)
}

// waitAnswered waits until the simulator holds no approval whose answer it
// never delivered (it cancels each at its decision deadline), or until
// deadline, when every such approval has been cancelled or answered.
func waitAnswered(t *testing.T, ctx context.Context, simURL string, deadline time.Time) {
	t.Helper()
	for {
		unanswered := 0
		for _, s := range simAudit(t, ctx, simURL) {
			for i, status := range s.statuses {
				if (status == "authorized" || status == "captured") && !s.answered[i] {
					unanswered++
				}
			}
		}
		if unanswered == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}
