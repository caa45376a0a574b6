package chaos_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The clients of TestProcessorFaults: merchants charging test cards at the
// simulator through the service, each charge under a key of its own, saved
// before the first send and used for every retry: after no answer, a 500,
// 503 or 409 idempotency-key-in-use, and after a 202 (the outcome not known
// yet), honouring its Retry-After.

// cardPlan is one client charge, drawn from the scenario's seed before the
// run, so that a seed names the same charges whatever the interleaving.
type cardPlan struct {
	method  string
	amount  int64
	capture bool
	// follow is what the client asks after a 201: "refund" (of a charge
	// captured), "capture" or "void" (of an authorization), or nothing.
	follow string
}

// planCharges draws n charges: mostly pm_card_approve, some declines, some
// decided later (pm_card_async_pending) or slowly (pm_card_slow); one in
// eight an authorization only (capture false); a refund asked after one
// captured charge in six, a capture or a void after one authorization in
// two.
func planCharges(rng *rand.Rand, n int) []cardPlan {
	methods := []struct {
		name   string
		weight int
	}{
		{"pm_card_approve", 70},
		{"pm_card_decline_insufficient_funds", 5},
		{"pm_card_decline_do_not_honor", 5},
		{"pm_card_async_pending", 10},
		{"pm_card_slow", 10},
	}
	plans := make([]cardPlan, n)
	for i := range plans {
		w := rng.IntN(100)
		m := methods[0].name
		for _, c := range methods {
			if w < c.weight {
				m = c.name
				break
			}
			w -= c.weight
		}
		p := cardPlan{method: m, amount: 100 + rng.Int64N(9900), capture: rng.IntN(8) != 0}
		switch {
		case p.capture && rng.IntN(6) == 0:
			p.follow = "refund"
		case !p.capture && rng.IntN(2) == 0:
			p.follow = [...]string{"capture", "void"}[rng.IntN(2)]
		}
		plans[i] = p
	}
	return plans
}

// body is the JSON body of the plan's charge.
func (p cardPlan) body() []byte {
	b := `{"payment_method":"` + p.method + `","amount":` + itoa(p.amount) + `,"currency":"EUR"`
	if !p.capture {
		b += `,"capture":false`
	}
	return []byte(b + "}")
}

// cardCharge is a client's charge: its key, its body, and every answer it
// got that was not a transport error or a "retry" status.
type cardCharge struct {
	plan     cardPlan
	key      string
	body     []byte
	id       string    // the charge's id, from the first answer naming it
	definite []answer  // 201s and 402s (the first, and every replay asked)
	accepted []answer  // 202s
	other    []answer  // anything else: a violation
	parked   bool      // left undecided (202) for the pass after recovery
	answered time.Time // when the first 201, 402 or 202 came: the charge was written
}

// last is the latest definite answer, or the zero answer.
func (c *cardCharge) last() answer {
	if len(c.definite) == 0 {
		return answer{}
	}
	return c.definite[len(c.definite)-1]
}

// cardClients drive the plans through c and keep every charge.
type cardClients struct {
	c *client
	// polls is how many times a client asks again after a 202 before it
	// leaves the charge for later (parked).
	polls int

	accepted, parked                  atomic.Int64 // 202 answers; charges left undecided
	followed, unsupported, followRest atomic.Int64 // captures, voids, refunds: done, refused 409, answered otherwise
	firstRefusal                      atomic.Value // the body of the first 409 refusal, for the log

	mu      sync.Mutex
	charges []*cardCharge
	follows []op
}

// all returns every charge driven so far.
func (cc *cardClients) all() []*cardCharge {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return append([]*cardCharge(nil), cc.charges...)
}

// charge drives p: a new key, saved before anything is sent, then retries
// with it until the answer is 201 or 402, or until polls 202s have been
// answered (the charge is then parked for finish). ctx ending parks it too.
func (cc *cardClients) charge(ctx context.Context, p cardPlan) *cardCharge {
	ch := &cardCharge{plan: p, key: cc.c.newKey(), body: p.body()}
	cc.mu.Lock()
	cc.charges = append(cc.charges, ch)
	cc.mu.Unlock()
	cc.ask(ctx, ch, cc.polls)
	if ch.parked {
		cc.parked.Add(1)
	}
	return ch
}

// ask sends ch with its key until it is decided (201 or 402), or after
// polls more 202s, or when ctx ends: then it is parked.
func (cc *cardClients) ask(ctx context.Context, ch *cardCharge, polls int) {
	for attempt := 1; attempt <= maxAttempts && ctx.Err() == nil; attempt++ {
		a, err := cc.c.send(ctx, attempt, http.MethodPost, "/v1/charges", ch.key, ch.body)
		pause := 5*time.Millisecond + rand.N(20*time.Millisecond)
		if err == nil && ch.answered.IsZero() && (a.status == http.StatusCreated || a.status == http.StatusPaymentRequired ||
			a.status == http.StatusAccepted) {
			ch.answered = time.Now()
		}
		switch {
		case err != nil || cc.c.retryable(a):
		case a.status == http.StatusAccepted:
			cc.accepted.Add(1)
			cc.name(ch, a.field("id"))
			ch.accepted = append(ch.accepted, a)
			if polls == 0 {
				ch.parked = true
				return
			}
			polls--
			pause = retryAfter(a)
		case a.status == http.StatusCreated || a.status == http.StatusPaymentRequired:
			cc.name(ch, a.field("id")+a.field("charge_id"))
			ch.definite, ch.parked = append(ch.definite, a), false
			return
		default:
			ch.other = append(ch.other, a)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
	ch.parked = true
}

// name keeps the first charge id an answer gave ch.
func (cc *cardClients) name(ch *cardCharge, id string) {
	if ch.id == "" {
		ch.id = id
	}
}

// retryAfter is the pause a 202 asks for (1 s if it names none).
func retryAfter(a answer) time.Duration {
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

// follow asks, after a 201, what the plan says (a refund, a capture or a
// void) under a key of its own. Card charges may not support it yet: a 409
// that is not idempotency-key-in-use is counted as unsupported, not as
// success; a 2xx is recorded for the audit.
func (cc *cardClients) follow(ctx context.Context, ch *cardCharge) {
	var o op
	switch ch.plan.follow {
	case "refund":
		o = op{kind: "refund", path: "/v1/charges/" + ch.id + "/refunds", body: []byte(`{}`)}
	case "capture":
		o = captureOp(ch.id, "", 0)
	case "void":
		o = voidOp(ch.id, "")
	default:
		return
	}
	o = drive(ctx, cc.c, o)
	for polls := 0; o.answer.status == http.StatusAccepted && polls < 3 && ctx.Err() == nil; polls++ {
		time.Sleep(retryAfter(o.answer))
		a, _, err := cc.c.definite(ctx, http.MethodPost, o.path, o.key, o.body)
		if err == nil {
			o.answer = a
		}
	}
	switch o.answer.status {
	case http.StatusConflict:
		cc.unsupported.Add(1)
		cc.firstRefusal.CompareAndSwap(nil, ch.plan.follow+": "+string(o.answer.body))
	case http.StatusOK, http.StatusCreated:
		cc.followed.Add(1)
		cc.mu.Lock()
		cc.follows = append(cc.follows, o)
		cc.mu.Unlock()
	default:
		cc.followRest.Add(1)
	}
}

// finish asks every parked charge again with its key, once recovery has
// resolved every charge: the answer must now be final (201 or 402), or a
// 202 naming requires_review.
func (cc *cardClients) finish(ctx context.Context) (stillOpen []string) {
	for _, ch := range cc.all() {
		if !ch.parked {
			continue
		}
		cc.ask(ctx, ch, 0)
		if ch.parked {
			if n := len(ch.accepted); n > 0 && ch.accepted[n-1].field("status") == "requires_review" {
				continue
			}
			stillOpen = append(stillOpen, ch.key+" ("+ch.id+")")
		}
	}
	return stillOpen
}

// replayAll asks every decided charge once more: the same status and bytes,
// marked as a replay. It returns the charges whose replay differs.
func (cc *cardClients) replayAll(ctx context.Context) (mismatch []string) {
	for _, ch := range cc.all() {
		first := ch.last()
		if first.status == 0 {
			continue
		}
		a, _, err := cc.c.definite(ctx, http.MethodPost, "/v1/charges", ch.key, ch.body)
		if err != nil || a.status != first.status || string(a.body) != string(first.body) || !a.replayed() {
			mismatch = append(mismatch, ch.id+": "+strconv.Itoa(a.status)+" "+string(a.body)+" after "+
				strconv.Itoa(first.status)+" "+string(first.body))
			continue
		}
		ch.definite = append(ch.definite, a)
	}
	return mismatch
}

// badAccepted checks a 202: the charge as it stands (status processing,
// reversing or requires_review), a Location naming it and a Retry-After.
func badAccepted(a answer) error {
	id := a.field("id")
	switch {
	case !strings.HasPrefix(id, "ch_"):
		return errors.New("202 names no charge: " + string(a.body))
	case a.header.Get("Location") != "/v1/charges/"+id:
		return errors.New("202 with Location " + a.header.Get("Location") + " for " + id)
	case a.header.Get("Retry-After") == "":
		return errors.New("202 without Retry-After for " + id)
	}
	switch s := a.field("status"); s {
	case "processing", "reversing", "requires_review":
		return nil
	default:
		return errors.New("202 for " + id + " in status " + s)
	}
}
