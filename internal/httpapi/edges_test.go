package httpapi_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
)

// The contract at its edges: null never moves the most money a route can,
// and the all-zero id is an id like any other.

// TestNullNeverTakesTheMostMoney: a capture or a refund whose amount is null,
// or whose whole body is null, is refused naming what is wrong, and moves
// nothing; before, null read as "absent": the whole authorization captured,
// everything left refunded.
func TestNullNeverTakesTheMostMoney(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	auth := f.authorize(acct, 400)
	paid := f.post("/v1/charges", uuid.NewString(), chargeBody(acct, 300)).json(t)["id"].(string)
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/charges/" + auth + "/capture", `null`, ""},
		{"/v1/charges/" + auth + "/capture", `{"amount":null}`, "amount"},
		{"/v1/charges/" + paid + "/refunds", `null`, ""},
		{"/v1/charges/" + paid + "/refunds", `{"amount":null}`, "amount"},
		{"/v1/charges/" + auth + "/void", `null`, ""},
	} {
		r := f.post(tc.path, uuid.NewString(), tc.body)
		if r.status != http.StatusBadRequest || r.code(t) != "invalid-request" || r.json(t)["field"] != nilIfEmpty(tc.field) ||
			!strings.Contains(r.json(t)["detail"].(string), "null") {
			t.Errorf("POST %s %s: %d %s, want 400 invalid-request naming null and %q", tc.path, tc.body, r.status, r.body, tc.field)
		}
	}
	if c := f.get("/v1/charges/" + auth).json(t); c["status"] != "authorized" || c["amount_captured"] != 0.0 {
		t.Errorf("the authorization after the refusals: %v", c)
	}
	if c := f.get("/v1/charges/" + paid).json(t); c["amount_refunded"] != 0.0 {
		t.Errorf("the charge after the refusals: %v", c)
	}
	if balance, available := f.money(acct); balance != 700 || available != 300 {
		t.Errorf("balance %d, available %d; want 700 and 300: the refusals moved money", balance, available)
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestTheZeroIDIsAnID: acct_000…0 passes the spec's pattern, and names an
// account that does not exist, answered as any other such: its charge, its
// list filter and a cursor of ch_000…0 are answered as another unknown id's,
// not as "account_id is required" or an ignored filter or cursor.
func TestTheZeroIDIsAnID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	f.post("/v1/charges", uuid.NewString(), chargeBody(acct, 100))
	hex := func(zero bool) string {
		if zero {
			return strings.Repeat("0", 32)
		}
		return strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	answer := func(zero bool) []string {
		var out []string
		for _, r := range []reply{
			f.post("/v1/charges", uuid.NewString(), chargeBody("acct_"+hex(zero), 100)),
			f.get("/v1/charges?account_id=acct_" + hex(zero)),
			f.get("/v1/charges?starting_after=ch_" + hex(zero)),
			f.get("/v1/events?starting_after=evt_" + hex(zero)),
		} {
			out = append(out, fmt.Sprint(r.status, " ", r.code(t)))
		}
		return out
	}
	got, want := answer(true), answer(false)
	if !slices.Equal(got, want) {
		t.Errorf("the zero ids: %q, want as other unknown ids: %q", got, want)
	}
	if n := len(f.get("/v1/charges?account_id=" + acct).json(t)["data"].([]any)); n != 1 {
		t.Errorf("the account's own list: %d charges, want 1", n)
	}
}

// TestExpirySweepIsBoundedByHolds: the expiry sweep's transaction writes at
// most its batch of holds, however many one account has: it was bounded by
// accounts (every expired hold of the oldest holds' accounts), so one
// account's 200,000 one-cent holds made one 7.5 s transaction that held back
// every merchant's events (the event horizon). Each sweep here expires its
// batch, the account's held and the charge.expired events following exactly.
// On a database of its own: a sweep takes every merchant's expired holds,
// and the package database holds other tests'.
func TestExpirySweepIsBoundedByHolds(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) })
	acct := f.account("USD", 1000)
	const holds, batch = 250, 100
	for range holds {
		f.authorize(acct, 1)
	}
	if _, err := f.db.Exec(t.Context(), `UPDATE charges SET expires_at = now() - interval '1 second'
        WHERE merchant_id = $1 AND status = 'authorized'`, f.merchantID); err != nil {
		t.Fatal(err)
	}
	sweep := postgres.NewHolds(f.store.DB)
	left := holds
	for _, want := range []int{batch, batch, holds - 2*batch, 0} {
		n, ran, err := sweep.ExpireHolds(t.Context(), batch)
		if err != nil || !ran || n != int64(want) {
			t.Fatalf("a sweep of %d: %d expired (ran %t, %v), want %d", batch, n, ran, err, want)
		}
		left -= want
		if held := f.count(`SELECT coalesce(sum(held), 0) FROM accounts WHERE merchant_id = $1`); held != left {
			t.Errorf("held %d after the sweep, want %d", held, left)
		}
		if expired := f.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = 'charge.expired'`); expired != holds-left {
			t.Errorf("%d charge.expired events, want %d", expired, holds-left)
		}
	}
	f.wantMoney(acct, 1000, 1000)
}

// TestExpirySweepPacesItsBatches: the sweep rests ExpiryPause between two
// full batches, so that one account's mass of expiries cannot queue every
// other merchant's events behind its own at the relay (make
// bench-isolation: 200,000 holds at one moment made others' events up to a
// second late). 250 holds in batches of 100: all expired, with their events,
// after two pauses at least.
func TestExpirySweepPacesItsBatches(t *testing.T) {
	t.Parallel()
	f := setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) })
	acct := f.account("USD", 1000)
	const holds = 250
	for range holds {
		f.authorize(acct, 1)
	}
	if _, err := f.db.Exec(t.Context(), `UPDATE charges SET expires_at = now() - interval '1 second'
        WHERE merchant_id = $1 AND status = 'authorized'`, f.merchantID); err != nil {
		t.Fatal(err)
	}
	sweep := charging.NewExpirySweep(postgres.NewHolds(f.store.DB), slog.New(slog.DiscardHandler), time.Hour, 100)
	began := time.Now()
	n, err := sweep.Sweep(t.Context())
	if took := time.Since(began); err != nil || n != holds || took < 2*charging.ExpiryPause {
		t.Fatalf("a sweep of %d holds in batches of 100: %d expired in %s (%v), want all, after two pauses of %s",
			holds, n, took, err, charging.ExpiryPause)
	}
	if expired := f.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = 'charge.expired'`); expired != holds {
		t.Errorf("%d charge.expired events, want %d", expired, holds)
	}
	f.wantMoney(acct, 1000, 1000)
}
