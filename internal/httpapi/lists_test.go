package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

type listPage struct {
	Object  string            `json:"object"`
	Data    []json.RawMessage `json:"data"`
	HasMore bool              `json:"has_more"`
}

type listItem struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	AccountID string          `json:"account_id"`
	CreatedAt string          `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

func (f *fixture) list(path string) (listPage, []listItem) {
	f.t.Helper()
	r := f.get(path)
	if r.status != http.StatusOK {
		f.t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var p listPage
	if err := json.Unmarshal(r.body, &p); err != nil || p.Object != "list" {
		f.t.Fatalf("GET %s: not a list: %s", path, r.body)
	}
	items := make([]listItem, len(p.Data))
	for i, raw := range p.Data {
		if err := json.Unmarshal(raw, &items[i]); err != nil {
			f.t.Fatal(err)
		}
	}
	return p, items
}

// TestChargeListPagesNeverRepeatOrSkip pages through the charges while new
// ones keep arriving: every charge that existed before is seen exactly once,
// newest first.
func TestChargeListPagesNeverRepeatOrSkip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1_000_000)
	other := f.account("USD", 1_000_000)
	existing := map[string]bool{}
	for range 25 {
		existing[f.charge(acct, 10)] = true
	}
	f.charge(other, 10)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				f.charge(acct, 1)
			}
		}
	})

	seen := map[string]int{}
	var last string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		path := "/v1/charges?limit=4&account_id=" + acct + after
		p, items := f.list(path)
		for _, it := range items {
			seen[it.ID]++
			if it.AccountID != acct {
				t.Errorf("filtered list holds a charge of %s", it.AccountID)
			}
			if last != "" && it.CreatedAt > last {
				t.Errorf("not newest first: %s after %s", it.CreatedAt, last)
			}
			last = it.CreatedAt
		}
		if !p.HasMore {
			break
		}
		after = "&starting_after=" + items[len(items)-1].ID
	}
	close(stop)
	wg.Wait()

	for id := range existing {
		if seen[id] != 1 {
			t.Errorf("charge %s seen %d times, want once", id, seen[id])
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("charge %s repeated %d times", id, n)
		}
	}

	_, all := f.list("/v1/charges?limit=100")
	if len(all) < 27 {
		t.Errorf("unfiltered list has %d charges, want both accounts' (at least 27)", len(all))
	}
}

// TestListHasMoreOnlyWhenMoreExist: a page that holds the last charges says
// has_more false even when it is exactly full, and a page with charges after
// it says true.
func TestListHasMoreOnlyWhenMoreExist(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := f.account("USD", 1000)
	ids := []string{f.charge(acct, 1), f.charge(acct, 2), f.charge(acct, 3)} // listed newest first
	for _, c := range []struct {
		query   string
		want    []string
		hasMore bool
	}{
		{"limit=3", []string{ids[2], ids[1], ids[0]}, false},
		{"limit=2", []string{ids[2], ids[1]}, true},
		{"limit=2&starting_after=" + ids[1], []string{ids[0]}, false},
		{"limit=1&starting_after=" + ids[1], []string{ids[0]}, false},
		{"limit=1&starting_after=" + ids[0], nil, false},
	} {
		p, items := f.list("/v1/charges?" + c.query)
		var got []string
		for _, it := range items {
			got = append(got, it.ID)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") || p.HasMore != c.hasMore {
			t.Errorf("GET /v1/charges?%s = %v, has_more %v; want %v, has_more %v", c.query, got, p.HasMore, c.want, c.hasMore)
		}
	}
}

func TestListParametersAreChecked(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, q := range []string{
		"limit=0", "limit=101", "limit=ten", "limit=", "limit=5&limit=6",
		"starting_after=acct_" + strings.Repeat("1", 32), "starting_after=ch_" + strings.Repeat("1", 32),
		"account_id=nope", "acount_id=acct_x",
	} {
		if r := f.get("/v1/charges?" + q); r.status != http.StatusBadRequest || r.code(t) != "invalid-request" {
			t.Errorf("GET /v1/charges?%s = %d %s, want 400", q, r.status, r.body)
		}
	}
	if r := f.get("/v1/events?starting_after=evt_" + strings.Repeat("2", 32)); r.status != http.StatusBadRequest {
		t.Errorf("events with an unknown cursor = %d %s", r.status, r.body)
	}
	if p, items := f.list("/v1/charges?limit=100"); p.HasMore || len(items) != 0 {
		t.Errorf("a new merchant's list = %+v", p)
	}
	other := f.otherMerchant().account("USD", 0)
	if r := f.get("/v1/charges?account_id=" + other); r.status != http.StatusNotFound || r.code(t) != "not-found" {
		t.Errorf("listing by another merchant's account = %d %s, want 404", r.status, r.body)
	}
}

// TestEventsOnePerEffectiveChange drives a mix of operations, each retried and
// raced by duplicates, then checks the outbox holds exactly one event per
// change and that the feed pages through all of them once.
func TestEventsOnePerEffectiveChange(t *testing.T) {
	t.Parallel()
	f := setup(t)
	other := f.otherMerchant()
	other.account("USD", 100) // another merchant's events never show

	// send issues the same request three times at once, then once more.
	send := func(path, key, body string) reply {
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { f.post(path, key, body) })
		}
		wg.Wait()
		return f.post(path, key, body)
	}
	var accounts []string
	for i := range 3 {
		r := send("/v1/accounts", fmt.Sprintf("acct-%d", i), `{"currency":"USD"}`)
		accounts = append(accounts, r.json(t)["id"].(string))
		send("/v1/accounts/"+accounts[i]+"/deposits", fmt.Sprintf("dep-%d", i), `{"amount":1000}`)
	}
	var charges []string
	for i := range 21 {
		acct := accounts[i%3]
		r := send("/v1/charges", fmt.Sprintf("ch-%d", i), chargeBody(acct, 150)) // the 7th on an account fails
		if r.status == http.StatusCreated {
			charges = append(charges, r.json(t)["id"].(string))
		}
	}
	for i, ch := range charges[:5] {
		send("/v1/charges/"+ch+"/refunds", fmt.Sprintf("re-%d", i), `{"amount":50}`)
	}
	// Refusals that move no money write no event.
	eur := f.account("EUR", 0)
	send("/v1/charges", "mismatch", `{"account_id":"`+eur+`","amount":1,"currency":"USD"}`)
	send("/v1/charges/"+charges[0]+"/refunds", "too-much", `{"amount":99999}`)
	f.post("/v1/charges", "ch-0", chargeBody(accounts[0], 151)) // key reuse: 422

	tables := map[string]string{
		"account.created":  `SELECT count(*) FROM accounts WHERE merchant_id = $1`,
		"deposit.created":  `SELECT count(*) FROM deposits WHERE merchant_id = $1`,
		"charge.succeeded": `SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'succeeded'`,
		"charge.failed":    `SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'failed'`,
		"refund.created":   `SELECT count(*) FROM refunds WHERE merchant_id = $1`,
	}
	want := map[string]int{"account.created": 4, "deposit.created": 3, "charge.succeeded": 18, "charge.failed": 3, "refund.created": 5}
	total := 0
	for typ, sql := range tables {
		rows := f.count(sql)
		events := f.count(`SELECT count(*) FROM events WHERE merchant_id = $1 AND type = $2`, typ)
		distinct := f.count(`SELECT count(DISTINCT aggregate_id) FROM events WHERE merchant_id = $1 AND type = $2`, typ)
		if rows != want[typ] || events != rows || distinct != rows {
			t.Errorf("%s: %d rows (want %d), %d events, %d distinct objects", typ, rows, want[typ], events, distinct)
		}
		total += rows
	}

	// The feed: every event once, oldest first, each refund after its charge.
	var feed []listItem
	// The feed lists an event once every transaction of this database that
	// began before it has ended (other databases on the server, other test
	// packages' among them, do not hold it back); the fixture's own
	// background work may still be running.
	const bound = 30 * time.Second
	deadline := time.Now().Add(bound)
	for len(feed) < total && time.Now().Before(deadline) {
		feed = nil
		after := ""
		for {
			p, items := f.list("/v1/events?limit=7" + after)
			feed = append(feed, items...)
			if !p.HasMore {
				break
			}
			after = "&starting_after=" + items[len(items)-1].ID
		}
		if len(feed) < total {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if len(feed) != total {
		t.Fatalf("after %v the feed lists %d events, the tables hold %d changes", bound, len(feed), total)
	}
	position := map[string]int{}
	for i, e := range feed {
		var obj struct {
			ID       string `json:"id"`
			ChargeID string `json:"charge_id"`
		}
		if err := json.Unmarshal(e.Data, &obj); err != nil || obj.ID == "" {
			t.Fatalf("event %s has no object in data: %s", e.ID, e.Data)
		}
		if _, dup := position[e.ID]; dup {
			t.Errorf("event %s appears twice", e.ID)
		}
		position[e.ID], position[obj.ID] = i, i
		if obj.ChargeID != "" {
			if at, ok := position[obj.ChargeID]; !ok || at > i {
				t.Errorf("refund %s comes before its charge %s", obj.ID, obj.ChargeID)
			}
		}
	}
}
