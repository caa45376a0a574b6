package chaos_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestLostAcknowledgementOfCaptures is TestLostAcknowledgement for the steps
// after an authorization: each round authorizes a charge (every fourth
// authorization's acknowledgement lost too), then captures all of it, part of
// it, or voids it, with the proxy losing the capture's or void's COMMIT
// acknowledgement (every fourth round: the COMMIT itself). The first answer
// must be a retryable 503; the retry with the same key gets the original 200,
// replayed (or, after a lost commit, a fresh execution), and asking once more
// gets the same bytes. A capture with a new key is then refused 409
// charge-not-capturable, naming the status the first left. At the end each
// authorization is settled once: balance debited once, one charge.captured or
// charge.voided event per charge, no hold left, available = balance.
func TestLostAcknowledgementOfCaptures(t *testing.T) {
	rounds := scale(16, 200)
	s := startScenario(t, scale(60*time.Second, 10*time.Minute), testDatabase, "lost-capture-ack")
	ctx, bin, dbURL, m, db, began := s.ctx, s.bin, s.dbURL, s.merchants[0], s.db, s.began
	proxy, proxied := newProxy(t, dbURL)
	svc := newService(t, bin, serviceConfig{databaseURL: proxied})
	c := newClient(t, m.APIKey, "lostcapture-key-", func(int) string { return svc.url() })

	acct := c.mustAccount(t, ctx, usd)
	ops := []op{drive(ctx, c, op{kind: "deposit", path: "/v1/accounts/" + acct + "/deposits", account: acct,
		amount: 1_000_000, body: []byte(`{"amount":1000000}`)})}

	var (
		losses                                       = newLosses()
		captures, partial, voids, refusals, replayed int
		wrongOutcome, wrongReplay, wrongRefusal      int
	)
	for i := range rounds {
		amount := int64(1000 + i)
		auth := op{kind: "authorize", path: "/v1/charges", account: acct, amount: amount, body: authorizeBody(acct, amount)}
		if i%4 == 1 {
			auth = losses.loseOnce(t, ctx, proxy, db, c, auth, loseAck, http.StatusCreated)
		} else {
			auth = drive(ctx, c, auth)
		}
		ops = append(ops, auth)
		charge := auth.answer.field("id")
		if auth.answer.status != http.StatusCreated || auth.answer.field("status") != "authorized" {
			t.Fatalf("round %d: authorization answered %d %s", i, auth.answer.status, auth.answer.body)
		}

		f, settle, want := loseAck, captureOp(charge, acct, 0), "succeeded"
		if i%4 == 3 {
			f = loseCommit
		}
		switch i % 3 {
		case 1:
			settle = captureOp(charge, acct, amount/3)
			partial++
		case 2:
			settle, want = voidOp(charge, acct), "voided"
		}
		settle = losses.loseOnce(t, ctx, proxy, db, c, settle, f, http.StatusOK)
		ops = append(ops, settle)
		if settle.kind == "void" {
			voids++
		} else {
			captures++
		}
		wantCaptured := int64(0)
		if want == "succeeded" {
			wantCaptured = cmp.Or(settle.amount, amount)
		}
		if got := chargeOf(settle.answer); got.Status != want || got.AmountCaptured != wantCaptured {
			wrongOutcome++
			t.Errorf("round %d: %s answered %s; want status %q, amount_captured %d", i, settle.kind, settle.answer.body, want, wantCaptured)
		}

		// The outcome stands: asked again with its key, the same bytes;
		// with a new key, a capture is refused, naming what the charge is.
		again, err := c.send(ctx, 1, http.MethodPost, settle.path, settle.key, settle.body)
		if err != nil || again.status != http.StatusOK || !again.replayed() || !bytes.Equal(again.body, settle.answer.body) {
			wrongReplay++
			t.Errorf("round %d: %s asked again: %d (replayed %v, %v) %s; first %s", i, settle.kind, again.status, again.replayed(), err, again.body, settle.answer.body)
		}
		replayed++
		second := drive(ctx, c, captureOp(charge, acct, 0))
		ops = append(ops, second)
		refusals++
		if second.answer.status != http.StatusConflict || second.answer.code() != "charge-not-capturable" ||
			second.answer.field("charge_status") != want {
			wrongRefusal++
			t.Errorf("round %d: a second capture with a new key answered %d %s; want 409 charge-not-capturable, charge_status %q",
				i, second.answer.status, second.answer.body, want)
		}
	}

	a := auditDatabase(t, ctx, db, m.ID)
	a.report(t)
	broken, moneyGap := checkClientView(t, ctx, db, m.ID, ops)
	if a.authorizations != rounds || a.captured != captures || a.voided != voids {
		broken++
		t.Errorf("%d authorizations, %d captured, %d voided in the database; %d, %d, %d were answered",
			a.authorizations, a.captured, a.voided, rounds, captures, voids)
	}
	broken += checkAvailable(t, ctx, c, acct)
	if leaked := logsMention(svc.logs.String(), "lostcapture-key-", m.APIKey); len(leaked) > 0 {
		t.Errorf("the service logged %q", leaked)
		broken++
	}
	t.Logf("%d rounds: %d captures (%d partial), %d voids; %d acknowledgements and %d commits lost of %d key-claiming commits "+
		"through the proxy; first answers by status %v; %d settlements asked again, %d captures with a new key refused; "+
		"%d requests, %d replays",
		rounds, captures, partial, voids, proxy.acksLost.Load(), proxy.commitsLost.Load(), proxy.commits.Load(),
		losses.firstStatus, replayed, refusals, c.stats.requests.Load(), c.stats.replayed.Load())

	summary{
		scenario: "lost acknowledgement of captures and voids (proxy drops the commit's answer, or the commit)",
		requests: c.stats.requests.Load(),
		faults: fmt.Sprintf("%d commit acknowledgements lost, %d commits lost (%d captures, %d of them partial, %d voids; every fourth authorization's acknowledgement lost too)",
			proxy.acksLost.Load(), proxy.commitsLost.Load(), captures, partial, voids),
		duplicates: a.duplicateCharges + a.settledTwice,
		lost:       int(moneyGap) + a.missingEvents,
		violations: a.violations() + broken + losses.wrong() + wrongOutcome + wrongReplay + wrongRefusal + int(c.stats.internal.Load()),
		command:    reproduce("TestLostAcknowledgementOfCaptures"),
	}.log(t, time.Since(began))
}

// storedCharge is what a test reads of a charge in an answer.
type storedCharge struct {
	ID             string `json:"id"`
	Status         string `json:"status"`
	Amount         int64  `json:"amount"`
	AmountCaptured int64  `json:"amount_captured"`
}

func chargeOf(a answer) storedCharge {
	var c storedCharge
	_ = json.Unmarshal(a.body, &c)
	return c
}

// checkAvailable reads the account over HTTP and fails t unless its available
// funds equal its balance: no hold is left once every authorization is
// settled or expired. It returns 1 for a failure.
func checkAvailable(t *testing.T, ctx context.Context, c *client, acct string) int {
	t.Helper()
	a := c.get(t, ctx, "/v1/accounts/"+acct)
	var v struct {
		Balance   *int64 `json:"balance"`
		Available *int64 `json:"available"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil || a.status != http.StatusOK || v.Balance == nil || v.Available == nil ||
		*v.Available != *v.Balance {
		t.Errorf("GET /v1/accounts/%s: %d %s; want available = balance", acct, a.status, a.body)
		return 1
	}
	return 0
}
