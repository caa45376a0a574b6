package httpapi_test

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/pgtest"
)

var (
	authorizeSteps = flag.Int("authorize.steps", 150, "steps of TestAuthorizeProperty; raise it for a longer run")
	authorizeSeed  = flag.Uint64("authorize.seed", 0, "seed of TestAuthorizeProperty; 0 draws one (the test logs it)")
)

// TestAuthorizeProperty runs a random sequence of authorizations, plain
// charges, captures (whole, partial, too large), voids, expiries (the
// controlled clock: a hold's expires_at moved into the past), sweeps,
// refunds, deposits and retries with a used key on three accounts, and
// checks every answer against the model (authorize_model_test.go), the money
// every few steps, and at the end the tables and one event per transition.
// A failure names the seed: go test -run TestAuthorizeProperty
// -authorize.seed=N -authorize.steps=M ./internal/httpapi/ replays it.
func TestAuthorizeProperty(t *testing.T) {
	t.Parallel()
	seed := *authorizeSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d: rerun with -authorize.seed=%d -authorize.steps=%d", seed, seed, *authorizeSteps)
	// A database of its own: the sweep expires every hold it finds.
	p := &property{fixture: setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) }),
		rng: rand.New(rand.NewPCG(seed, seed)), seed: seed, m: newModel()}
	for range 3 {
		deposit := p.rng.Int64N(2000)
		acct := p.account("USD", deposit)
		p.accts, p.m.balance[acct] = append(p.accts, acct), deposit
	}
	steps := []struct {
		weight int
		run    func()
	}{
		{4, func() { p.create(false) }}, {2, func() { p.create(true) }}, {4, p.capture}, {2, p.void},
		{2, p.expire}, {1, p.sweep}, {2, p.refund}, {1, p.deposit}, {1, p.retry},
	}
	total := 0
	for _, s := range steps {
		total += s.weight
	}
	for p.step = 1; p.step <= *authorizeSteps; p.step++ {
		n := p.rng.IntN(total)
		for _, s := range steps {
			if n -= s.weight; n < 0 {
				s.run()
				break
			}
		}
		if p.step%25 == 0 {
			p.checkMoney()
		}
	}
	p.sweep()
	p.checkMoney()
	p.checkEvents()
}

// property is the state of TestAuthorizeProperty's run.
type property struct {
	*fixture
	rng   *rand.Rand
	seed  uint64
	step  int
	m     *model
	accts []string
	sent  []sentCall // every POST made, for retries with its key
}

type sentCall struct {
	call
	r reply
}

// fail stops the run, naming the seed and the step.
func (p *property) fail(format string, args ...any) {
	p.t.Helper()
	p.t.Fatalf("seed %d, step %d: %s", p.seed, p.step, fmt.Sprintf(format, args...))
}

// post sends c, logs it and keeps it for retries.
func (p *property) post(c call) reply {
	p.t.Helper()
	r := p.fixture.post(c.path, c.key, c.body)
	p.t.Logf("step %d: POST %s %s -> %d %s", p.step, c.path, c.body, r.status, r.body)
	p.sent = append(p.sent, sentCall{c, r})
	return r
}

// expect checks an answer's status and, for a refusal, its problem.
func (p *property) expect(r reply, o outcome) {
	p.t.Helper()
	if r.status != o.status {
		p.fail("answered %d %s, the model says %d %s", r.status, r.body, o.status, o.code)
	}
	if o.code == "" {
		return
	}
	got := r.json(p.t)
	if cs, _ := got["charge_status"].(string); got["code"] != o.code || cs != o.chargeStatus {
		p.fail("answered %s, the model says %s with charge_status %q", r.body, o.code, o.chargeStatus)
	}
}

// checkCharge compares a charge object, answered or read, with the model's.
func (p *property) checkCharge(got map[string]any, c *modelCharge) {
	p.t.Helper()
	if got["id"] != c.id || got["account_id"] != c.acct || got["status"] != c.status || got["amount"] != float64(c.amount) ||
		got["amount_captured"] != float64(c.captured) || got["amount_refunded"] != float64(c.refunded) {
		p.fail("charge %v, the model says %+v", got, *c)
	}
}

// reread reads c over GET and compares it with the model.
func (p *property) reread(c *modelCharge) {
	p.t.Helper()
	p.checkCharge(p.get("/v1/charges/"+c.id).json(p.t), c)
}

// pick returns a charge, one of those in status (if any) most of the time;
// nil if there are none at all.
func (p *property) pick(status string) *modelCharge {
	var some []*modelCharge
	for _, id := range p.m.order {
		if c := p.m.charges[id]; c.status == status {
			some = append(some, c)
		}
	}
	if len(some) > 0 && p.rng.IntN(5) > 0 {
		return some[p.rng.IntN(len(some))]
	}
	if len(p.m.order) == 0 {
		return nil
	}
	return p.m.charges[p.m.order[p.rng.IntN(len(p.m.order))]]
}

// amount draws an amount for a body of up to limit (and a bit over):
// 0 and "" or `{}` for none.
func (p *property) amount(limit int64) (int64, string) {
	switch p.rng.IntN(6) {
	case 0:
		return 0, ""
	case 1:
		return 0, "{}"
	}
	n := 1 + p.rng.Int64N(max(limit, 1)+limit/4+10)
	return n, fmt.Sprintf(`{"amount":%d}`, n)
}

func (p *property) create(capture bool) {
	acct := p.accts[p.rng.IntN(len(p.accts))]
	avail := p.m.available(acct)
	amount := 1 + p.rng.Int64N(max(avail, 1)+avail/4+10)
	o, record := p.m.create(acct, amount, capture)
	body := fmt.Sprintf(`{"account_id":%q,"amount":%d,"currency":"USD","capture":%t}`, acct, amount, capture)
	r := p.post(call{"/v1/charges", uuid.NewString(), body})
	p.expect(r, o)
	got := r.json(p.t)
	if o.status != http.StatusCreated {
		p.reread(record(got["charge_id"].(string)))
		return
	}
	c := record(got["id"].(string))
	p.checkCharge(got, c)
	if (got["expires_at"] != nil) != c.authorization {
		p.fail("expires_at %v of a charge with capture %t", got["expires_at"], capture)
	}
}

func (p *property) capture() {
	c := p.pick("authorized")
	if c == nil {
		return
	}
	n, body := p.amount(c.amount)
	r := p.post(call{"/v1/charges/" + c.id + "/capture", uuid.NewString(), body})
	o := p.m.capture(c, n)
	p.expect(r, o)
	if o.status == http.StatusOK {
		p.checkCharge(r.json(p.t), c)
	}
	p.reread(c)
}

func (p *property) void() {
	c := p.pick("authorized")
	if c == nil {
		return
	}
	r := p.post(call{"/v1/charges/" + c.id + "/void", uuid.NewString(), []string{"", "{}"}[p.rng.IntN(2)]})
	o := p.m.void(c)
	p.expect(r, o)
	if o.status == http.StatusOK {
		p.checkCharge(r.json(p.t), c)
	}
	p.reread(c)
}

func (p *property) refund() {
	c := p.pick("succeeded")
	if c == nil {
		return
	}
	n, body := p.amount(c.captured - c.refunded)
	if body == "" {
		body = "{}" // a refund's body is required
	}
	r := p.post(call{"/v1/charges/" + c.id + "/refunds", uuid.NewString(), body})
	o, refunded := p.m.refund(c, n)
	p.expect(r, o)
	if o.status == http.StatusCreated {
		if got := r.json(p.t); got["amount"] != float64(refunded) || got["charge_id"] != c.id {
			p.fail("refund %s, the model refunded %d", r.body, refunded)
		}
	}
	p.reread(c)
}

func (p *property) deposit() {
	acct := p.accts[p.rng.IntN(len(p.accts))]
	n := 1 + p.rng.Int64N(1000)
	p.expect(p.post(call{"/v1/accounts/" + acct + "/deposits", uuid.NewString(), fmt.Sprintf(`{"amount":%d}`, n)}), outcome{status: 201})
	p.m.balance[acct] += n
}

// expire moves an authorization's expires_at into the past, whatever its
// state: only one still authorized changes.
func (p *property) expire() {
	c := p.pick("authorized")
	if c == nil || !c.authorization || c.status == "failed" {
		return
	}
	p.t.Logf("step %d: expire %s (%s)", p.step, c.id, c.status)
	p.expireIn(c.id, -time.Duration(1+p.rng.IntN(1000))*time.Millisecond)
	p.m.expire(c)
	p.reread(c)
}

func (p *property) sweep() {
	got, want := p.fixture.sweep(), p.m.sweep()
	p.t.Logf("step %d: sweep expired %d", p.step, got)
	if got != want {
		p.fail("the sweep expired %d holds, the model %d", got, want)
	}
}

// retry sends a POST made before with its key: the same bytes come back.
func (p *property) retry() {
	if len(p.sent) == 0 {
		return
	}
	s := p.sent[p.rng.IntN(len(p.sent))]
	r := p.post(s.call)
	if r.status != s.r.status || !bytes.Equal(r.body, s.r.body) || r.header.Get("Idempotent-Replayed") != "true" {
		p.fail("retry of %s %s: %d %s (replayed %q), first %d %s", s.path, s.body, r.status, r.body,
			r.header.Get("Idempotent-Replayed"), s.r.status, s.r.body)
	}
}

// checkMoney compares every account's balance and available with the
// model's, and the tables with each other.
func (p *property) checkMoney() {
	p.t.Helper()
	for _, acct := range p.accts {
		if b, a := p.money(acct); b != p.m.balance[acct] || a != p.m.available(acct) {
			p.fail("account %s: balance %d, available %d; the model says %d, %d", acct, b, a, p.m.balance[acct], p.m.available(acct))
		}
		p.checkLedger(acct)
	}
	if n := p.count(`SELECT count(*) FROM accounts a WHERE merchant_id = $1 AND held <> (SELECT coalesce(sum(amount), 0)
        FROM charges c WHERE c.merchant_id = a.merchant_id AND c.account_id = a.id AND c.status = 'authorized')`); n != 0 {
		p.fail("%d accounts whose held is not the sum of their authorizations not yet settled or swept", n)
	}
}

// checkEvents wants one event per transition of each charge, the
// authorization's first, and one refund.created per refund.
func (p *property) checkEvents() {
	p.t.Helper()
	got := p.chargeEvents()
	if len(got) != len(p.m.charges) {
		p.fail("events about %d charges, the model made %d", len(got), len(p.m.charges))
	}
	for _, id := range p.m.order {
		wantEvents(p.t, got, id, p.m.charges[id].events())
	}
	if n := p.count(`SELECT count(*) FROM events e JOIN events a ON a.merchant_id = e.merchant_id
        AND a.type = 'charge.authorized' AND a.payload->>'id' = e.payload->>'id'
        WHERE e.merchant_id = $1 AND e.type <> 'charge.authorized' AND e.seq < a.seq`); n != 0 {
		p.fail("%d charge events precede their charge.authorized", n)
	}
	if n := p.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = 'refund.created'`); n != p.m.refunds {
		p.fail("%d refund.created events, the model made %d refunds", n, p.m.refunds)
	}
	p.t.Logf("%d steps: %d charges, %d refunds", p.step-1, len(p.m.charges), p.m.refunds)
}
