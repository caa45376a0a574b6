package chaos_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/payments/internal/payment"
)

// cardAudit is what holding the simulator's audit against the service's
// card charges found (compareCards). The first group describes the run;
// every other count must be zero.
type cardAudit struct {
	charges   int
	byStatus  map[string]int
	sim       simRef // the simulator's counts over every reference
	redriven  int    // references with more than one payment at the simulator
	recovered int    // charges recovery checked at least once (a lookup, a re-drive, a reversal)

	doubleApprovals int   // approvals beyond one per reference, that is per client charge
	lostApprovals   int   // live approvals the service does not hold as succeeded or authorized with their amount
	lostMoney       int64 // their amounts
	phantoms        int   // charges the service holds as succeeded or authorized with no live approval of their amount
	phantomMoney    int64
	moneyDiffers    int // captured or refunded amounts, or authorized versus captured, differ
	strangers       int // references at the simulator that name no card charge of ours
	keyless         int // card charges named by no key, or by more than one
	stuck           int // charges still processing or reversing
	missingEvents   int // transitions without their event
	doubledEvents   int // transitions with more than one event
	strayEvents     int // events no transition explains, or saying another status or amount
	roundsDiffer    int // charges whose charge.reversing events are not their reversal rounds
	review          []string
}

// lost is the money found lost either way (an approval the service does not
// know, a success with no approval behind it), plus transitions without
// their event.
func (a cardAudit) lost() int { return int(a.lostMoney+a.phantomMoney) + a.missingEvents }

// violations counts the other broken invariants.
func (a cardAudit) violations() int {
	return a.moneyDiffers + a.strangers + a.keyless + a.stuck + a.doubledEvents + a.strayEvents + a.roundsDiffer
}

func (a cardAudit) String() string {
	s := a.sim
	return fmt.Sprintf("%d card charges by status %v; at the simulator %d approvals, %d declines, %d expiries, %d reversals, "+
		"%d reversals refused, %d captures, %d voids, %d refunds, %d references with more than one payment; "+
		"%d charges checked by recovery; "+
		"double approvals %d, lost approvals %d (%d), successes without a live approval %d (%d), money differing %d, "+
		"references not ours %d, charges without exactly one key %d, still open %d, transitions without their event %d, "+
		"transitions with two %d, stray events %d, reversal rounds differing %d",
		a.charges, a.byStatus, s.Approvals, s.Declines, s.Expiries, s.Reversals, s.ReversalRefusals, s.Captures, s.Voids,
		s.Refunds, a.redriven, a.recovered, a.doubleApprovals, a.lostApprovals, a.lostMoney, a.phantoms, a.phantomMoney, a.moneyDiffers,
		a.strangers, a.keyless, a.stuck, a.missingEvents, a.doubledEvents, a.strayEvents, a.roundsDiffer)
}

// addCounts adds the simulator's counts of o to s's.
func (s *simRef) addCounts(o *simRef) {
	s.Approvals += o.Approvals
	s.Declines += o.Declines
	s.Captures += o.Captures
	s.Voids += o.Voids
	s.Refunds += o.Refunds
	s.Reversals += o.Reversals
	s.ReversalRefusals += o.ReversalRefusals
	s.Expiries += o.Expiries
}

// reportf fails t with a problem, the first 20 of a kind only.
func reportf(t *testing.T, seen map[string]int, kind, format string, args ...any) {
	t.Helper()
	seen[kind]++
	if seen[kind] <= 20 {
		t.Errorf(kind+": "+format, args...)
	}
}

// compareCards holds every reference at the simulator against the card
// charge it names, and every card charge against the simulator: at most one
// approval per reference; every live approval (not declined, voided,
// reversed or expired there) known to the service as succeeded or
// authorized with its amount and nothing else live; every success of the
// service a live approval of its amount, captured and refunded as the
// service says; every charge final or in review, named by one key, with
// one event per transition.
func compareCards(t *testing.T, rows map[string]*cardRow, refs map[string]*simRef) cardAudit {
	t.Helper()
	a := cardAudit{charges: len(rows), byStatus: map[string]int{}}
	seen := map[string]int{}
	for ref, s := range refs {
		a.sim.addCounts(s)
		if s.payments > 1 {
			a.redriven++
		}
		if s.Approvals > 1 {
			a.doubleApprovals += s.Approvals - 1
			reportf(t, seen, "double approval", "%s: %v", ref, s)
		}
		if rows[ref] == nil {
			a.strangers++
			reportf(t, seen, "reference not ours", "%s: %v", ref, s)
			if s.live > 0 {
				a.lostApprovals++
				a.lostMoney += s.approved
			}
		}
	}
	for id, r := range rows {
		a.byStatus[r.status]++
		if r.attempts+r.reversalRound > 0 {
			a.recovered++
		}
		s := refs[id]
		if s == nil {
			s = &simRef{}
		}
		switch r.status {
		case "processing", "reversing":
			a.stuck++ // waitResolved listed it
		case "requires_review":
			a.review = append(a.review, fmt.Sprintf("%s (%d, last %s): %v", id, r.amount, r.lastCode, s))
		case "succeeded", "authorized":
			switch {
			case s.live != 1 || s.approved != r.amount:
				a.phantoms++
				a.phantomMoney += r.amount
				reportf(t, seen, "success without a live approval", "%s %s of %d: %v", id, r.status, r.amount, s)
			case (r.status == "authorized") != (s.cap == 0) || s.cap != r.captured || s.refunded != r.refunded:
				a.moneyDiffers++
				reportf(t, seen, "money differs", "%s %s, captured %d, refunded %d: %v", id, r.status, r.captured, r.refunded, s)
			}
		default: // failed, reversed, voided: nothing may be live
			if s.live > 0 {
				a.lostApprovals++
				a.lostMoney += s.approved
				reportf(t, seen, "lost approval", "%s is %s in the service (last code %q): %v", id, r.status, r.lastCode, s)
			}
		}
		if r.keys != 1 {
			a.keyless++
			reportf(t, seen, "keys", "%s is named by %d keys", id, r.keys)
		}
		for _, p := range a.walk(r) {
			reportf(t, seen, "events", "%s (%s): %s", id, r.status, p)
		}
	}
	return a
}

// cardView is what the clients were shown, held against the service's keys
// and the simulator. Every count must be zero.
type cardView struct {
	unapproved int // 201s for a charge the processor did not approve (or took back)
	notStored  int // definite answers that are not the response stored under their key
	keys       int // client keys not stored, or naming another charge than the client was shown
	duplicates int // card charges beyond one per client key
	accepted   int // 202s without the charge as it stands, its Location or Retry-After
	other      int // answers other than 201, 402 and 202
}

func (v cardView) violations() int { return v.unapproved + v.notStored + v.keys + v.accepted + v.other }

// storedCardKey is a key bound to a card charge, and its stored response.
type storedCardKey struct {
	storedKey
	charge string
}

// cardKeys reads the merchant's keys bound to an operation.
func cardKeys(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID) map[string]storedCardKey {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT key, status, body, `+bodyEncoding+`, operation_id
FROM idempotency_keys k WHERE merchant_id = $1 AND operation_id IS NOT NULL`, mid)
	must(t, err, "select keys")
	defer rows.Close()
	out := map[string]storedCardKey{}
	for rows.Next() {
		var (
			k        storedCardKey
			encoding *string
			op       uuid.UUID
		)
		must(t, rows.Scan(&k.key, &k.status, &k.body, &encoding, &op), "scan key")
		if encoding != nil && *encoding == "zstd" && k.body != nil {
			body, err := zstdDecoder.DecodeAll(k.body, nil)
			must(t, err, "decompress the body of key %q", k.key)
			k.body = body
		}
		k.charge = payment.FormatID(payment.PrefixCharge, op)
		out[k.key] = k
	}
	must(t, rows.Err(), "select keys")
	return out
}

// viewCards holds every client charge's answers against its key and the
// simulator: the key stored and naming the charge the client was shown;
// every 201 or 402 the client got the key's stored response, byte for
// byte; a 201 only for a charge the simulator approved and did not take
// back (no reversal, no expiry); every 202 the charge as it stands.
func viewCards(t *testing.T, charges []*cardCharge, keys map[string]storedCardKey, rows map[string]*cardRow,
	refs map[string]*simRef,
) cardView {
	t.Helper()
	var v cardView
	seen, unapproved := map[string]int{}, map[string]int{}
	for _, ch := range charges {
		k, ok := keys[ch.key]
		switch {
		case !ok:
			v.keys++
			reportf(t, seen, "client key", "%s (%s, %s) is not stored", ch.key, ch.id, ch.plan.method)
		case ch.id != "" && k.charge != ch.id:
			v.keys++
			reportf(t, seen, "client key", "%s names %s, the client was shown %s", ch.key, k.charge, ch.id)
		}
		shown := false
		for _, a := range ch.definite {
			if k.status == nil || int(*k.status) != a.status || !bytes.Equal(k.body, a.body) {
				v.notStored++
				reportf(t, seen, "answer not stored", "%s: the client got %d %s", ch.key, a.status, a.body)
			}
			shown = shown || a.status == http.StatusCreated
		}
		if s := refs[ch.id]; shown && (s == nil || s.Approvals == 0 || s.Reversals+s.Expiries > 0) {
			v.unapproved++
			unapproved[ch.plan.method]++
			reportf(t, seen, "success shown unapproved", "%s (%s, %v) answered 201, %v", ch.id, ch.plan.method,
				rows[ch.id], s)
		}
		for _, a := range ch.accepted {
			if err := badAccepted(a); err != nil {
				v.accepted++
				reportf(t, seen, "202", "%s: %v", ch.key, err)
			}
		}
		for _, a := range ch.other {
			v.other++
			reportf(t, seen, "unexpected answer", "%s (%s): %d %s", ch.key, ch.plan.method, a.status, a.body)
		}
	}
	if v.unapproved > 0 {
		t.Errorf("%d charges answered 201 that the processor did not approve or took back, by payment method: %v", v.unapproved, unapproved)
	}
	if n := len(rows) - len(charges); n > 0 {
		v.duplicates = n
		t.Errorf("%d card charges for %d client charges", len(rows), len(charges))
	}
	return v
}

// waitResolved waits until no card charge of the merchant is processing or
// reversing, for up to bound; then it fails t listing those still open,
// with what the simulator did under each.
func waitResolved(t *testing.T, ctx context.Context, db *pgxpool.Pool, mid uuid.UUID, bound time.Duration, simURL string) time.Duration {
	t.Helper()
	began := time.Now()
	for {
		var open int
		must(t, db.QueryRow(ctx, `SELECT count(*) FROM charges WHERE merchant_id = $1 AND status IN ('processing', 'reversing')`,
			mid).Scan(&open), "count open charges")
		if open == 0 {
			return time.Since(began)
		}
		if time.Since(began) > bound || ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	refs := simAudit(t, ctx, simURL)
	rows, err := db.Query(ctx, `SELECT c.id, c.status, o.state, o.attempts, o.reversal_attempts, coalesce(o.last_code, ''),
       o.next_check_at, o.decision_deadline, c.created_at
FROM charges c JOIN processor_operations o ON o.merchant_id = c.merchant_id AND o.id = c.id
WHERE c.merchant_id = $1 AND c.status IN ('processing', 'reversing') ORDER BY c.created_at`, mid)
	must(t, err, "select open charges")
	defer rows.Close()
	var stuck []string
	for rows.Next() {
		var (
			id                  uuid.UUID
			status, state, code string
			attempts, reversals int
			next                *time.Time
			deadline, created   time.Time
		)
		must(t, rows.Scan(&id, &status, &state, &attempts, &reversals, &code, &next, &deadline, &created), "scan open charge")
		ref := payment.FormatID(payment.PrefixCharge, id)
		stuck = append(stuck, fmt.Sprintf("%s %s (operation %s, %d checks, %d reversals refused, last %q, next check %v, "+
			"deadline %v, created %v): %v", ref, status, state, attempts, reversals, code, next, deadline, created, refs[ref]))
	}
	must(t, rows.Err(), "select open charges")
	sort.Strings(stuck)
	t.Errorf("%d card charges still open %v after the traffic (the recovery bound):\n%s", len(stuck), bound,
		strings.Join(stuck[:min(len(stuck), 30)], "\n"))
	return time.Since(began)
}
