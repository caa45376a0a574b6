package chaos_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"payments/internal/pgtest"
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
	checkLeaks(t)
	rounds := scale(16, 200)
	ctx, cancel := context.WithTimeout(context.Background(), scale(60*time.Second, 10*time.Minute))
	defer cancel()
	began := time.Now()

	bin := buildBinary(t)
	dbURL := pgtest.NewDatabase(t)
	m := migrateAndRegister(t, bin, dbURL, "lost-ack")[0]
	proxy, proxied := newProxy(t, dbURL)
	svc := newService(t, bin, serviceConfig{databaseURL: proxied})
	c := newClient(t, m.APIKey, "lostack-key-", func(int) string { return svc.url() })

	db, err := pgxpool.New(ctx, dbURL)
	must(t, err, "connect")
	t.Cleanup(db.Close)

	acct := c.mustCreate(t, ctx, "/v1/accounts", `{"currency":"USD"}`)
	var ops []op
	opening := drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
		amount: 1_000_000, body: []byte(`{"amount":1000000}`)})
	ops = append(ops, opening)

	var (
		firstStatus          = map[int]int{} // status of the request whose COMMIT was lost or unacknowledged
		wrongFirst, notFired int
		wrongRetry           int
		lastCharge           string
	)
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
		o.key = c.newKey()

		proxy.arm(f)
		first, err := c.send(ctx, 1, http.MethodPost, o.path, o.key, o.body)
		if got, ok := proxy.waitFired(); !ok || got != f {
			notFired++
			t.Errorf("round %d: the proxy's %s did not happen (%v)", i, f, got)
			proxy.arm(noFault)
		}
		// The fault did what it says: after a lost acknowledgement the key
		// and its response are committed; after a lost commit, nothing is.
		var committed bool
		must(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM idempotency_keys WHERE key = $1)`, o.key).Scan(&committed), "look up key")
		if committed != (f == loseAck) {
			notFired++
			t.Errorf("round %d (%s of a %s): after the fault the key is committed: %v", i, f, o.kind, committed)
		}
		firstStatus[first.status]++
		if err != nil || first.status != http.StatusServiceUnavailable || first.code() != "service-unavailable" ||
			first.header.Get("Retry-After") == "" {
			wrongFirst++
			t.Errorf("round %d (%s of a %s): first answer %d %s (Retry-After %q, %v); want 503 service-unavailable with Retry-After",
				i, f, o.kind, first.status, first.body, first.header.Get("Retry-After"), err)
		}

		a, attempts, err := c.definite(ctx, http.MethodPost, o.path, o.key, o.body)
		must(t, err, "round %d: retry", i)
		o.answer, o.attempts = a, attempts+1
		ops = append(ops, o)
		// A lost acknowledgement is answered by the replay of what was
		// committed; a lost commit by a fresh execution.
		if a.status != http.StatusCreated || a.replayed() != (f == loseAck) {
			wrongRetry++
			t.Errorf("round %d (%s of a %s): retry answered %d (replayed %v) %s", i, f, o.kind, a.status, a.replayed(), a.body)
		}
		if o.kind == "charge" {
			lastCharge = a.field("id")
		}
	}

	a := auditDatabase(t, ctx, db, m.ID)
	a.report(t)
	broken, moneyGap := checkClientView(t, ctx, db, m.ID, ops)
	if leaked := logsMention(svc.logs.String(), "lostack-key-", m.APIKey); len(leaked) > 0 {
		t.Errorf("the service logged %q", leaked)
		broken++
	}
	t.Logf("%d rounds: %d acknowledgements and %d commits lost (%d at the Sync of a one-statement charge, the rest at COMMIT) "+
		"of %d key-claiming commits through the proxy; first answers by status %v; %d requests, %d replays",
		rounds, proxy.acksLost.Load(), proxy.commitsLost.Load(), proxy.atSync.Load(), proxy.commits.Load(), firstStatus,
		c.stats.requests.Load(), c.stats.replayed.Load())

	summary{
		scenario: "lost acknowledgement (proxy drops the commit's answer, or the commit)",
		requests: c.stats.requests.Load(),
		faults: fmt.Sprintf("%d commit acknowledgements lost, %d commits lost (%d of them at a one-statement charge's Sync)",
			proxy.acksLost.Load(), proxy.commitsLost.Load(), proxy.atSync.Load()),
		duplicates: a.duplicateCharges,
		lost:       int(moneyGap) + a.missingEvents,
		violations: a.violations() + broken + wrongFirst + notFired + wrongRetry + int(c.stats.internal.Load()),
		command:    reproduce("TestLostAcknowledgement"),
	}.log(t, time.Since(began))
}
