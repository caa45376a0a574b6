package chaos_test

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestReplicas runs three "payments serve" processes on one database and
// sends 120 concurrent requests with one key and one body, spread across
// them and released together: exactly one charge, and every answer is the
// same bytes. Some rounds charge more than the balance holds, so the one
// outcome to agree on is a recorded failed charge (402).
func TestReplicas(t *testing.T) {
	const (
		nReplicas  = 3
		concurrent = 120
	)
	rounds := scale(3, 30)
	s := startScenario(t, scale(60*time.Second, 10*time.Minute), testDatabase, "replicas")
	ctx, bin, dbURL, m, began := s.ctx, s.bin, s.dbURL, s.merchants[0], s.began
	var replicas []*service
	for range nReplicas {
		replicas = append(replicas, newService(t, bin, serviceConfig{databaseURL: dbURL}))
	}
	c := newClient(t, m.APIKey, "replicas-key-", func(attempt int) string { return replicas[attempt%nReplicas].url() })

	acct := c.mustAccount(t, ctx, usd)
	var ops []op
	ops = append(ops, drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
		amount: 1_000_000, body: []byte(`{"amount":1000000}`)}))

	var (
		disagreements, unresolved int
		fresh                     int // answers not marked as replays: executions and coalesced waiters
	)
	for round := range rounds {
		amount := int64(1000 + round)
		if round%3 == 2 {
			amount = 99_000_000 // more than the balance: a 402 to agree on
		}
		o := op{kind: "charge", path: "/v1/charges", account: acct, amount: amount, body: chargeBody(acct, amount), key: c.newKey()}

		// Request i goes to replica i mod 3 first; its retries move on.
		answers := make([]answer, concurrent)
		errs := make([]error, concurrent)
		barrier := make(chan struct{})
		var wg sync.WaitGroup
		for i := range concurrent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rc := *c
				rc.base = func(attempt int) string { return replicas[(i+attempt-1)%nReplicas].url() }
				<-barrier
				answers[i], _, errs[i] = rc.definite(ctx, http.MethodPost, o.path, o.key, o.body)
			}()
		}
		close(barrier)
		wg.Wait()

		o.answer = answers[0]
		for i, a := range answers {
			if errs[i] != nil {
				unresolved++
				t.Errorf("round %d, request %d: %v", round, i, errs[i])
				continue
			}
			if !a.replayed() {
				fresh++
			}
			if a.status != o.answer.status || !bytes.Equal(a.body, o.answer.body) {
				disagreements++
				t.Errorf("round %d: request %d got %d %s, request 0 got %d %s", round, i, a.status, a.body, o.answer.status, o.answer.body)
			}
		}
		want := http.StatusCreated
		if amount > 1_000_000 {
			want = http.StatusPaymentRequired
		}
		if o.answer.status != want {
			t.Errorf("round %d: answered %d %s, want %d", round, o.answer.status, o.answer.body, want)
		}
		ops = append(ops, o)
	}

	db, err := pgxpool.New(ctx, dbURL)
	must(t, err, "connect")
	t.Cleanup(db.Close)
	a := auditDatabase(t, ctx, db, m.ID)
	a.report(t)
	if a.charges != rounds {
		t.Errorf("%d charges after %d rounds, want one each", a.charges, rounds)
	}
	broken, moneyGap := checkClientView(t, ctx, db, m.ID, ops)
	for i, r := range replicas {
		if leaked := logsMention(r.logs.String(), "replicas-key-", m.APIKey); len(leaked) > 0 {
			t.Errorf("replica %d logged %q", i, leaked)
			broken++
		}
	}
	st := c.stats
	t.Logf("%d rounds of %d concurrent requests on %d replicas: %d requests, %d 409 in-use, %d 503, %d replays, %d answers not marked as replays",
		rounds, concurrent, nReplicas, st.requests.Load(), st.inUse.Load(), st.unavailable.Load(), st.replayed.Load(), fresh)

	summary{
		scenario:   "replicas (one key, 3 processes, 120 concurrent)",
		requests:   st.requests.Load(),
		faults:     fmt.Sprintf("%d rounds × %d concurrent retries of one key across %d processes", rounds, concurrent, nReplicas),
		duplicates: a.duplicateCharges + max(0, a.charges-rounds),
		lost:       int(moneyGap) + a.missingEvents,
		violations: a.violations() + broken + disagreements + unresolved + int(st.internal.Load()),
		command:    reproduce("TestReplicas"),
	}.log(t, time.Since(began))
}
