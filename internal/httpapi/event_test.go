package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/pgtest"
)

// feedWithin pages the merchant's whole feed until it lists at least n
// events (the feed lists an event a moment after its commit), and returns
// each entry's id and its bytes as the list carries them.
func (f *fixture) feedWithin(n int, bound time.Duration) (ids []string, raw map[string]json.RawMessage) {
	f.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		ids, raw = nil, map[string]json.RawMessage{}
		after := ""
		for {
			p, items := f.list("/v1/events?limit=100" + after)
			for i, it := range items {
				ids, raw[it.ID] = append(ids, it.ID), p.Data[i]
			}
			if !p.HasMore {
				break
			}
			after = "&starting_after=" + items[len(items)-1].ID
		}
		if len(ids) >= n || time.Now().After(deadline) {
			return ids, raw
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGetEventIsTheFeedsEntry: GET /v1/events/{id} answers every event of
// the feed with exactly the bytes the list carries for it (a description
// with <, > and & included, which an HTML-escaping encoder would change),
// and answers 404 not-found, never 400, for another merchant's event, the
// all-zero id, an id of another kind and a malformed one, as the other
// resources do.
func TestGetEventIsTheFeedsEntry(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1_000)
	ch := f.post("/v1/charges", "ch-event",
		`{"account_id":"`+acct+`","amount":300,"currency":"USD","description":"<b>Tom & Jerry</b>","metadata":{"order":"é-1"}}`)
	if ch.status != http.StatusCreated {
		t.Fatalf("charge: %d %s", ch.status, ch.body)
	}
	ids, raw := f.feedWithin(3, 30*time.Second) // account.created, deposit.created, charge.succeeded
	if len(ids) != 3 {
		t.Fatalf("the feed lists %d events after 30 s, want 3", len(ids))
	}
	for _, id := range ids {
		r := f.get("/v1/events/" + id)
		if r.status != http.StatusOK {
			t.Fatalf("GET /v1/events/%s = %d %s", id, r.status, r.body)
		}
		if got := bytes.TrimSuffix(r.body, []byte("\n")); !bytes.Equal(got, raw[id]) {
			t.Errorf("GET /v1/events/%s =\n%s\nthe feed lists\n%s", id, got, raw[id])
		}
	}
	if !strings.Contains(string(raw[ids[2]]), `"description":"<b>Tom & Jerry</b>"`) {
		t.Errorf("the charge's event %s does not carry its description as sent", raw[ids[2]])
	}

	other := f.otherMerchant()
	zero := "evt_" + strings.Repeat("0", 32)
	for _, c := range []struct {
		name string
		f    *fixture
		path string
	}{
		{"another merchant's event", other, "/v1/events/" + ids[2]},
		{"the zero id", f, "/v1/events/" + zero},
		{"an unknown id", f, "/v1/events/evt_" + strings.Repeat("7", 32)},
		{"a charge's id", f, "/v1/events/" + ch.json(t)["id"].(string)},
		{"a malformed id", f, "/v1/events/evt_NOPE"},
	} {
		r := c.f.get(c.path)
		if r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Errorf("%s: GET %s = %d %s, want 404 not-found", c.name, c.path, r.status, r.body)
		}
	}
	if r := f.get("/v1/events/" + ids[0] + "?expand=data"); r.status != http.StatusBadRequest || r.code(t) != "invalid-request" {
		t.Errorf("GET /v1/events/{id} with a query parameter = %d %s, want 400", r.status, r.body)
	}
}

// TestGetEventWaitsForTheFeed: an event the feed holds back, because a
// transaction of the database that began before its own still runs, is 404
// from GET /v1/events/{id} too, so that no reader sees by id an event its
// cursor could then page past. Once that transaction ends, the event is
// listed and read alike. On a database of its own: the held transaction
// holds back every event of its database.
func TestGetEventWaitsForTheFeed(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	f := setup(t, func(o *setupOptions) { o.databaseURL = url })
	acct := f.account("USD", 0)
	if ids, _ := f.feedWithin(1, 30*time.Second); len(ids) != 1 {
		t.Fatalf("the feed lists %v after 30 s, want the account's event", ids)
	}

	ctx := context.Background()
	holder, err := f.db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			if _, err := holder.Exec(ctx, `ROLLBACK`); err != nil {
				t.Error(err)
			}
		}
	}
	defer release()

	if r := f.post("/v1/accounts/"+acct+"/deposits", "dep-held", `{"amount":500}`); r.status != http.StatusCreated {
		t.Fatalf("deposit: %d %s", r.status, r.body)
	}
	var held string
	if err := f.db.QueryRow(ctx, `SELECT 'evt_' || replace(id::text, '-', '') FROM events
WHERE merchant_id = $1 AND type = 'deposit.created'`, f.merchantID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	// Held: neither listed nor read, however often asked.
	for range 3 {
		if ids, _ := f.feedWithin(0, 0); len(ids) != 1 {
			t.Fatalf("while an older transaction runs, the feed lists %v, want only the account's event", ids)
		}
		if r := f.get("/v1/events/" + held); r.status != http.StatusNotFound || r.code(t) != "not-found" {
			t.Fatalf("while the feed holds %s back, GET /v1/events/%s = %d %s, want 404", held, held, r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}

	release()
	ids, raw := f.feedWithin(2, 30*time.Second)
	if len(ids) != 2 || ids[1] != held {
		t.Fatalf("after the older transaction ended the feed lists %v, want the account's event and %s", ids, held)
	}
	r := f.get("/v1/events/" + held)
	if got := bytes.TrimSuffix(r.body, []byte("\n")); r.status != http.StatusOK || !bytes.Equal(got, raw[held]) {
		t.Errorf("once listed, GET /v1/events/%s = %d %s, want the feed's %s", held, r.status, r.body, raw[held])
	}
}
