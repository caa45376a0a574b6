package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// The races of authorize, capture and void, over HTTP on real PostgreSQL:
// many requests released
// together on one authorization or one account's funds. Exactly one outcome
// wins each race, every loser gets the documented answer, stored under its
// key byte for byte, and the money adds up.

// call is one POST of a race.
type call struct{ path, key, body string }

func (c call) is(action string) bool { return strings.HasSuffix(c.path, "/"+action) }

// race sends the calls released together by a start barrier and returns
// their definite answers, in order.
func (f *fixture) race(calls []call) []reply { return f.raceLagging(calls, nil) }

// raceLagging is race with the calls lagging says held back by 5 ms after
// the barrier opens.
func (f *fixture) raceLagging(calls []call, lagging func(call) bool) []reply {
	out := make([]reply, len(calls))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() {
			req := f.request(http.MethodPost, c.path, c.key, c.body)
			<-start
			if lagging != nil && lagging(c) {
				time.Sleep(5 * time.Millisecond)
			}
			out[i] = f.definite(c, f.do(req))
		})
	}
	close(start)
	wg.Wait()
	return out
}

// definite sends c again with its key while its answer r says to, as a
// client would: a 503, or a 409 idempotency-key-in-use. On a starved machine
// the queue on one account can outlast the server's wait bound.
func (f *fixture) definite(c call, r reply) reply {
	for attempt := 0; attempt < 40 && retryable(r); attempt++ {
		time.Sleep(50 * time.Millisecond)
		r = f.post(c.path, c.key, c.body)
	}
	return r
}

func retryable(r reply) bool {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(r.body, &p)
	return r.status == http.StatusServiceUnavailable || p.Code == "idempotency-key-in-use"
}

// wantStored checks that each call's answer is the response stored under
// its key, byte for byte, and that sending the call at i again replays it.
func (f *fixture) wantStored(calls []call, replies []reply, replay ...int) {
	f.t.Helper()
	for i, c := range calls {
		if status, body := f.storedResponse(c.key); status != replies[i].status || !bytes.Equal(body, replies[i].body) {
			f.t.Errorf("%s: answered %d %s, stored %d %s", c.path, replies[i].status, replies[i].body, status, body)
		}
	}
	for _, i := range replay {
		again := f.post(calls[i].path, calls[i].key, calls[i].body)
		if again.status != replies[i].status || !bytes.Equal(again.body, replies[i].body) || again.header.Get("Idempotent-Replayed") != "true" {
			f.t.Errorf("replay of %s: %d %s (replayed %q), first %d %s", calls[i].path, again.status, again.body,
				again.header.Get("Idempotent-Replayed"), replies[i].status, replies[i].body)
		}
	}
}

// chargeEvents counts the merchant's charge events, by charge id and type.
func (f *fixture) chargeEvents() map[string]map[string]int {
	f.t.Helper()
	rows, err := f.db.Query(context.Background(), `
SELECT payload->>'id', type, count(*) FROM events
WHERE merchant_id = $1 AND aggregate_type = 'charge' GROUP BY 1, 2`, f.merchantID)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var (
			id, typ string
			n       int
		)
		if err := rows.Scan(&id, &typ, &n); err != nil {
			f.t.Fatal(err)
		}
		if out[id] == nil {
			out[id] = map[string]int{}
		}
		out[id][typ] = n
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// wantEvents checks a charge's events against want (a type absent: none).
func wantEvents(t *testing.T, got map[string]map[string]int, charge string, want map[string]int) {
	t.Helper()
	for typ, n := range got[charge] {
		if n != want[typ] {
			t.Errorf("charge %s: %d %s events, want %d", charge, n, typ, want[typ])
		}
	}
	for typ, n := range want {
		if got[charge][typ] != n {
			t.Errorf("charge %s: %d %s events, want %d", charge, got[charge][typ], typ, n)
		}
	}
}

func shuffle(calls []call) {
	rand.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })
}

// TestCaptureRacesVoid: 25 captures (whole and partial) and 25 voids, each
// with its own key, on one authorization: one wins, the 49 others are told
// what the charge became. Rounds go on until both a capture and a void have
// won: after 5 fair rounds, the kind that has not won yet is given a 5 ms
// head start, so both outcomes are checked without tossing a coin.
func TestCaptureRacesVoid(t *testing.T) {
	t.Parallel()
	f := setup(t)
	won := map[string]int{}
	for round := 0; round < 10 && (round < 5 || len(won) < 2); round++ {
		var lagging func(call) bool
		if round >= 5 {
			late := won["succeeded"] > 0 // the captures have won: hold them back
			lagging = func(c call) bool { return c.is("capture") == late }
		}
		won[f.captureVoidRound(t, lagging)]++
	}
	t.Logf("winners over the rounds: %v", won)
	if len(won) < 2 {
		t.Errorf("only %v won, in every round; a capture and a void should each have won one", won)
	}
}

// captureVoidRound runs one race on a fresh authorization of 600 on an
// account of 1000 and returns the winner's outcome.
func (f *fixture) captureVoidRound(t *testing.T, lagging func(call) bool) string {
	acct := f.account("USD", 1000)
	ch := f.authorize(acct, 600)
	takes := map[string]int64{} // a capture's key: what it would take
	var calls []call
	for i := range 25 {
		c := call{"/v1/charges/" + ch + "/capture", uuid.NewString(), ""}
		takes[c.key] = 600
		switch i % 3 {
		case 1:
			c.body = "{}"
		case 2:
			takes[c.key] = int64(100 + 10*i)
			c.body = fmt.Sprintf(`{"amount":%d}`, takes[c.key])
		}
		calls = append(calls, c, call{"/v1/charges/" + ch + "/void", uuid.NewString(), []string{"", "{}"}[i%2]})
	}
	shuffle(calls)
	replies := f.raceLagging(calls, lagging)

	won := -1
	for i, r := range replies {
		if r.status == http.StatusOK {
			if won >= 0 {
				t.Fatalf("two winners:\n%s\n%s", replies[won].body, r.body)
			}
			won = i
		}
	}
	if won < 0 {
		t.Fatalf("no winner: %d %s", replies[0].status, replies[0].body)
	}
	outcome, event, taken := "voided", "charge.voided", int64(0)
	if calls[won].is("capture") {
		outcome, event, taken = "succeeded", "charge.captured", takes[calls[won].key]
	}
	if c := replies[won].json(t); c["status"] != outcome || c["amount_captured"] != float64(taken) || c["amount"] != 600.0 {
		t.Errorf("the winner (%s %s): %s", calls[won].path, calls[won].body, replies[won].body)
	}
	for i, r := range replies {
		switch {
		case i == won:
		case calls[i].is("capture"):
			wantRefused(t, r, http.StatusConflict, "charge-not-capturable", outcome)
		default:
			wantRefused(t, r, http.StatusConflict, "charge-not-voidable", outcome)
		}
	}
	f.wantMoney(acct, 1000-taken, 1000-taken)
	if got := f.get("/v1/charges/" + ch); !bytes.Equal(got.body, replies[won].body) {
		t.Errorf("GET the charge: %s\nthe winner said: %s", got.body, replies[won].body)
	}
	wantEvents(t, f.chargeEvents(), ch, map[string]int{"charge.authorized": 1, event: 1})
	f.wantStored(calls, replies, won, (won+1)%len(calls))
	return outcome
}

// TestTwoCapturesOneWins: on each of 10 authorizations, two captures with
// different keys and different amounts: one takes its amount, the other is
// told the charge succeeded.
func TestTwoCapturesOneWins(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 10_000)
	var calls []call
	takes := map[string]int64{}
	for i := range 10 {
		ch := f.authorize(acct, 500)
		for j, n := range []int64{int64(200 + i), int64(300 + i)} {
			c := call{"/v1/charges/" + ch + "/capture", uuid.NewString(), fmt.Sprintf(`{"amount":%d}`, n)}
			if j == 1 && i%2 == 0 {
				c.body, n = "", 500 // the whole authorization
			}
			calls, takes[c.key] = append(calls, c), n
		}
	}
	replies := f.race(calls) // in pairs: calls 2i and 2i+1 are on charge i
	var taken int64
	events := f.chargeEvents()
	for i := 0; i < len(calls); i += 2 {
		won, lost := i, i+1
		if replies[lost].status == http.StatusOK {
			won, lost = lost, won
		}
		c := replies[won].json(t)
		ch, _ := c["id"].(string)
		if replies[won].status != http.StatusOK || c["status"] != "succeeded" || c["amount_captured"] != float64(takes[calls[won].key]) {
			t.Errorf("the winner of %s: %d %s", calls[won].path, replies[won].status, replies[won].body)
		}
		wantRefused(t, replies[lost], http.StatusConflict, "charge-not-capturable", "succeeded")
		wantEvents(t, events, ch, map[string]int{"charge.authorized": 1, "charge.captured": 1})
		taken += takes[calls[won].key]
	}
	f.wantMoney(acct, 10_000-taken, 10_000-taken)
	f.wantStored(calls, replies, 0, 1)
}

// TestCaptureRacesRefunds: on each of 6 authorizations of 600, a capture of
// 400 and four refunds (two of 150, two of the rest) released together. A
// refund decided before the capture is a 409 charge-not-refundable; after
// it, a refund of what is left of the 400 captured, or 422 once nothing is.
func TestCaptureRacesRefunds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 10_000)
	var calls []call
	var charges []string
	for range 6 {
		ch := f.authorize(acct, 600)
		wantRefused(t, f.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), "{}"), http.StatusConflict, "charge-not-refundable", "")
		charges = append(charges, ch)
		calls = append(calls, call{"/v1/charges/" + ch + "/capture", uuid.NewString(), `{"amount":400}`})
		for _, body := range []string{`{"amount":150}`, `{}`, `{"amount":150}`, `{}`} {
			calls = append(calls, call{"/v1/charges/" + ch + "/refunds", uuid.NewString(), body})
		}
	}
	shuffle(calls)
	replies := f.race(calls)

	refunded := map[string]int64{}
	outcomes := map[string]int{}
	for i, r := range replies {
		ch := strings.Split(calls[i].path, "/")[3]
		switch {
		case calls[i].is("capture"):
			if c := r.json(t); r.status != http.StatusOK || c["status"] != "succeeded" || c["amount_captured"] != 400.0 {
				t.Errorf("capture of %s: %d %s", ch, r.status, r.body)
			}
		case r.status == http.StatusCreated:
			refunded[ch] += int64(r.json(t)["amount"].(float64))
			outcomes["refunded"]++
		case r.status == http.StatusConflict:
			wantRefused(t, r, http.StatusConflict, "charge-not-refundable", "")
			outcomes["before the capture"]++
		default:
			wantRefused(t, r, http.StatusUnprocessableEntity, "refund-exceeds-charge", "")
			outcomes["nothing left"]++
		}
	}
	t.Logf("refunds: %v", outcomes)
	var back int64
	for _, ch := range charges {
		c := f.get("/v1/charges/" + ch).json(t)
		if c["status"] != "succeeded" || c["amount_captured"] != 400.0 || c["amount_refunded"] != float64(refunded[ch]) || refunded[ch] > 400 {
			t.Errorf("charge after the race: %v; the 201s refunded %d", c, refunded[ch])
		}
		back += refunded[ch]
	}
	f.wantMoney(acct, 10_000-6*400+back, 10_000-6*400+back)
	if n := f.count(`SELECT count(*) FROM refunds WHERE merchant_id = $1`); n != outcomes["refunded"] {
		t.Errorf("%d refund rows, %d refunds answered 201", n, outcomes["refunded"])
	}
	// No refund's event comes before its charge's capture.
	if n := f.count(`SELECT count(*) FROM events r JOIN events c ON c.merchant_id = r.merchant_id
        AND c.type = 'charge.captured' AND c.payload->>'id' = r.payload->>'charge_id'
        WHERE r.merchant_id = $1 AND r.type = 'refund.created' AND r.seq < c.seq`); n != 0 {
		t.Errorf("%d refund.created events precede their charge's charge.captured", n)
	}
	f.wantStored(calls, replies, 0, 1)
}

// TestAuthorizationsCompeteForFunds: 30 authorizations and 10 plain charges
// of 100 race for a deposit of 1000: exactly 10 take it, whichever kind;
// the 30 others are stored 402s, each with its failed charge.
func TestAuthorizationsCompeteForFunds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	var calls []call
	for i := range 40 {
		c := call{"/v1/charges", uuid.NewString(), fmt.Sprintf(`{"account_id":%q,"amount":100,"currency":"USD","capture":false}`, acct)}
		if i%4 == 0 {
			c.body = chargeBody(acct, 100)
		}
		calls = append(calls, c)
	}
	shuffle(calls)
	replies := f.race(calls)

	won := map[string][]string{} // status: charge ids
	for i, r := range replies {
		switch r.status {
		case http.StatusCreated:
			c := r.json(t)
			want := map[bool]string{true: "authorized", false: "succeeded"}[strings.Contains(calls[i].body, "capture")]
			if c["status"] != want {
				t.Errorf("%s: %s, want %s", calls[i].body, r.body, want)
			}
			won[want] = append(won[want], c["id"].(string))
		default:
			wantRefused(t, r, http.StatusPaymentRequired, "insufficient-funds", "")
			won["failed"] = append(won["failed"], r.json(t)["charge_id"].(string))
		}
	}
	auth, plain := len(won["authorized"]), len(won["succeeded"])
	t.Logf("%d authorizations and %d charges took the funds", auth, plain)
	if auth+plain != 10 || len(won["failed"]) != 30 {
		t.Fatalf("%d authorized, %d succeeded, %d refused; want 10 winners and 30 refusals", auth, plain, len(won["failed"]))
	}
	f.wantMoney(acct, 1000-100*int64(plain), 0)
	events := f.chargeEvents()
	for status, ids := range won {
		for _, id := range ids {
			wantEvents(t, events, id, map[string]int{"charge." + status: 1})
		}
	}
	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1`); n != 40 {
		t.Errorf("%d charge rows, want 40", n)
	}
	f.wantStored(calls, replies, 0, 1)
	// A void gives its hold back to the next authorization, and only it.
	if auth > 0 {
		if r := f.post("/v1/charges/"+won["authorized"][0]+"/void", uuid.NewString(), ""); r.status != http.StatusOK {
			t.Fatalf("void: %d %s", r.status, r.body)
		}
		f.wantMoney(acct, 1000-100*int64(plain), 100)
		f.authorize(acct, 100)
		f.wantMoney(acct, 1000-100*int64(plain), 0)
	}
}
