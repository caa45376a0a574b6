package chaos_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestLostAcknowledgement is the seed problem of the field: the database
// commits the charge, and the acknowledgement is lost on the way back. A proxy
// between the service and PostgreSQL forwards the COMMIT, lets the server
// commit and answer, and drops the connection before the answer arrives. The
// service must answer with a retryable error (503), and the client's retry
// with the same key must receive the original charge, replayed; one charge
// exists. Every fourth round loses the COMMIT itself instead: the transaction
// rolls back, and the retry executes afresh. Deposits and refunds take the
// same faults.
func TestLostAcknowledgement(t *testing.T) {
	rounds := scale(16, 200)
	s := startScenario(t, scale(60*time.Second, 10*time.Minute), testDatabase, "lost-ack")
	ctx, bin, dbURL, m, db, began := s.ctx, s.bin, s.dbURL, s.merchants[0], s.db, s.began
	proxy, proxied := newProxy(t, dbURL)
	svc := newService(t, bin, serviceConfig{databaseURL: proxied})
	c := newClient(t, m.APIKey, "lostack-key-", func(int) string { return svc.url() })

	acct := c.mustAccount(t, ctx, usd)
	var ops []op
	opening := drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
		amount: 1_000_000, body: []byte(`{"amount":1000000}`)})
	ops = append(ops, opening)

	losses := newLosses()
	var lastCharge string
	for i := range rounds {
		f := loseAck
		if i%4 == 3 {
			f = loseCommit
		}
		o := op{kind: "charge", path: "/v1/charges", account: acct, amount: int64(100 + i), body: chargeBody(acct, int64(100+i))}
		switch {
		case i%5 == 4 && lastCharge != "":
			o = op{kind: "refund", path: "/v1/charges/" + lastCharge + "/refunds", account: acct, amount: 50,
				body: []byte(`{"amount":50}`)}
		case i%7 == 6:
			o = op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct, amount: 500,
				body: []byte(`{"amount":500}`)}
		}
		o = losses.loseOnce(t, ctx, proxy, db, c, o, f, http.StatusCreated)
		ops = append(ops, o)
		if o.kind == "charge" {
			lastCharge = o.answer.field("id")
		}
	}

	a := auditDatabase(t, ctx, db, m.ID)
	a.report(t)
	broken, moneyGap := checkClientView(t, ctx, db, m.ID, ops)
	if leaked := logsMention(svc.logs.String(), "lostack-key-", m.APIKey); len(leaked) > 0 {
		t.Errorf("the service logged %q", leaked)
		broken++
	}
	t.Logf("%d rounds: %d acknowledgements and %d commits lost (%d at a COMMIT pipelined with other statements, a charge batch's or a keyed write's, the rest at a COMMIT of its own) "+
		"of %d key-claiming commits through the proxy (%d units that failed instead, such as a charge batch decided ahead and refused, passed over); first answers by status %v; %d requests, %d replays",
		rounds, proxy.acksLost.Load(), proxy.commitsLost.Load(), proxy.atSync.Load(), proxy.commits.Load(), proxy.passedOver.Load(), losses.firstStatus,
		c.stats.requests.Load(), c.stats.replayed.Load())

	summary{
		scenario: "lost acknowledgement (proxy drops the commit's answer, or the commit)",
		requests: c.stats.requests.Load(),
		faults: fmt.Sprintf("%d commit acknowledgements lost, %d commits lost (%d of the faults at a pipelined COMMIT)",
			proxy.acksLost.Load(), proxy.commitsLost.Load(), proxy.atSync.Load()),
		duplicates: a.duplicateCharges,
		lost:       int(moneyGap) + a.missingEvents,
		violations: a.violations() + broken + losses.wrong() + int(c.stats.internal.Load()),
		command:    reproduce("TestLostAcknowledgement"),
	}.log(t, time.Since(began))
}

// TestLostAcknowledgementOfABatch: group commit makes one COMMIT carry many
// charges, so one lost acknowledgement leaves many clients without an answer.
// Eight charges are gathered into one batch (one batch in flight at a time,
// the only slot kept busy meanwhile by a charge that a trigger planted in the
// database holds for a second, its COMMIT already sent when the proxy is
// armed); the proxy drops the eight's batch's COMMIT acknowledgement. (A locked account no longer keeps the slot:
// its charge leaves the batch and waits alone.) Every one of the eight is answered 503,
// and every retry with its key replays its own charge: eight charges exist,
// not sixteen.
func TestLostAcknowledgementOfABatch(t *testing.T) {
	const members = 8
	s := startScenario(t, 60*time.Second, testDatabase, "lost-batch-ack")
	ctx, bin, dbURL, m, db := s.ctx, s.bin, s.dbURL, s.merchants[0], s.db
	proxy, proxied := newProxy(t, dbURL)
	svc := newService(t, bin, serviceConfig{databaseURL: proxied,
		extra: []string{"CHARGE_BATCHES=1", "IDEMPOTENCY_WAIT=1500ms", "DB_MAX_CONNS=4"}})
	c := newClient(t, m.APIKey, "lostbatch-key-", func(int) string { return svc.url() })

	holder := c.mustAccount(t, ctx, usd)
	acct := c.mustAccount(t, ctx, usd)
	c.post(t, ctx, "/v1/accounts/"+holder+"/deposits", c.newKey(), `{"amount":1000}`)
	c.post(t, ctx, "/v1/accounts/"+acct+"/deposits", c.newKey(), `{"amount":100000}`)

	// A charge of 1 takes the only batch slot for a second (its write
	// sleeps, its COMMIT already pipelined behind it), while the eight queue
	// behind it.
	_, err := db.Exec(ctx, `
CREATE FUNCTION hold_the_slot() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
CREATE TRIGGER hold_the_slot BEFORE INSERT ON charges FOR EACH ROW WHEN (NEW.amount = 1) EXECUTE FUNCTION hold_the_slot();`)
	must(t, err, "plant the trigger")

	first := make(chan answer, 1)
	go func() { first <- c.post(t, ctx, "/v1/charges", c.newKey(), string(chargeBody(holder, 1))) }()
	time.Sleep(300 * time.Millisecond) // let it take the slot and send its COMMIT
	proxy.arm(loseAck)

	keys := make([]string, members)
	answers := make([]answer, members)
	var wg sync.WaitGroup
	for i := range members {
		keys[i] = c.newKey()
		wg.Go(func() {
			a, err := c.send(ctx, 1, http.MethodPost, "/v1/charges", keys[i], chargeBody(acct, int64(100+i)))
			if err != nil {
				t.Errorf("member %d: %v", i, err)
			}
			answers[i] = a
		})
	}
	if a := <-first; a.status != http.StatusCreated {
		t.Errorf("the charge that held the slot got %d %s, want 201", a.status, a.body)
	}
	wg.Wait()
	if f, ok := proxy.waitFired(); !ok || f != loseAck {
		t.Fatalf("the proxy's lost acknowledgement did not happen (%v)", f)
	}
	if got := proxy.atSync.Load(); got != 1 {
		t.Errorf("%d faults at a batch's pipelined COMMIT, want 1", got)
	}
	var stored int
	must(t, db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = ANY($1)`, keys).Scan(&stored), "count keys")
	if stored != members {
		t.Fatalf("%d of the %d keys committed: they were not one batch", stored, members)
	}
	for i, a := range answers {
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("member %d: first answer %d %s, want 503 (its acknowledgement was lost)", i, a.status, a.body)
		}
	}

	// Every retry replays its own charge, with its own amount.
	ids := map[string]bool{}
	for i, key := range keys {
		a, _, err := c.definite(ctx, http.MethodPost, "/v1/charges", key, chargeBody(acct, int64(100+i)))
		must(t, err, "retry member %d", i)
		if a.status != http.StatusCreated || !a.replayed() {
			t.Errorf("member %d: retry answered %d (replayed %v) %s; want its stored charge, replayed", i, a.status, a.replayed(), a.body)
		}
		ids[a.field("id")] = true
	}
	var charges int
	var balance int64
	must(t, db.QueryRow(ctx, `SELECT count(*), (SELECT balance FROM accounts WHERE id = $1::uuid) FROM charges WHERE account_id = $1::uuid`,
		strings.TrimPrefix(acct, "acct_")).Scan(&charges, &balance), "count charges")
	want := int64(100000)
	for i := range members {
		want -= int64(100 + i)
	}
	if charges != members || len(ids) != members || balance != want {
		t.Errorf("%d charges, %d distinct ids in the replays, balance %d; want %d, %d, %d", charges, len(ids), balance, members, members, want)
	}
	t.Logf("one lost acknowledgement covered a batch of %d charges: %d answered 503, all %d retries replayed", members, members, members)
}

// losses counts what went wrong in rounds of lost commits and lost
// acknowledgements (loseOnce).
type losses struct {
	firstStatus map[int]int // status of the request whose COMMIT was lost or unacknowledged
	notFired    int         // faults that did not strike, or did not do what they say
	wrongFirst  int         // first answers other than a retryable 503
	wrongRetry  int         // retries answered other than the original outcome
}

func newLosses() *losses { return &losses{firstStatus: map[int]int{}} }

// wrong is every count of l that must be zero.
func (l *losses) wrong() int { return l.notFired + l.wrongFirst + l.wrongRetry }

// loseOnce sends o with a fresh key once, with f armed at the proxy for its
// commit, and checks what f left: the key and its response committed after a
// lost acknowledgement, nothing after a lost commit; the answer a 503
// service-unavailable with Retry-After. It then retries with the same key
// until the answer is definite: it must be want, the replay of what was
// committed after a lost acknowledgement, a fresh execution after a lost
// commit. It returns o with that answer.
func (l *losses) loseOnce(t *testing.T, ctx context.Context, proxy *pgProxy, db *pgxpool.Pool, c *client, o op, f fault, want int) op {
	t.Helper()
	o.key = c.newKey()
	proxy.arm(f)
	first, err := c.send(ctx, 1, http.MethodPost, o.path, o.key, o.body)
	if got, ok := proxy.waitFired(); !ok || got != f {
		l.notFired++
		t.Errorf("%s %s: the proxy's %s did not happen (%v)", o.kind, o.path, f, got)
		proxy.arm(noFault)
	}
	var committed bool
	must(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM idempotency_keys WHERE key = $1)`, o.key).Scan(&committed), "look up key")
	if committed != (f == loseAck) {
		l.notFired++
		t.Errorf("%s %s (%s): after the fault the key is committed: %v", o.kind, o.path, f, committed)
	}
	l.firstStatus[first.status]++
	if err != nil || first.status != http.StatusServiceUnavailable || first.code() != "service-unavailable" ||
		first.header.Get("Retry-After") == "" {
		l.wrongFirst++
		t.Errorf("%s %s (%s): first answer %d %s (Retry-After %q, %v); want 503 service-unavailable with Retry-After",
			o.kind, o.path, f, first.status, first.body, first.header.Get("Retry-After"), err)
	}
	a, attempts, err := c.definite(ctx, http.MethodPost, o.path, o.key, o.body)
	must(t, err, "%s %s: retry", o.kind, o.path)
	o.answer, o.attempts = a, attempts+1
	if a.status != want || a.replayed() != (f == loseAck) {
		l.wrongRetry++
		t.Errorf("%s %s (%s): retry answered %d (replayed %v) %s; want %d, replayed %v",
			o.kind, o.path, f, a.status, a.replayed(), a.body, want, f == loseAck)
	}
	return o
}
