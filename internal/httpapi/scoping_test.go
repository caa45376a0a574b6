package httpapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
)

// TestReadsAreScopedToTheMerchant: every read endpoint answers another
// merchant's object as unknown (404, or 400 for a list cursor), and no list
// shows another merchant's items.
func TestReadsAreScopedToTheMerchant(t *testing.T) {
	t.Parallel()
	a := setup(t)
	b := a.otherMerchant()

	// A's objects: an account with a deposit, two charges, a refund of the first.
	acct := a.account("USD", 1000)
	var dep string
	if r := a.post("/v1/accounts/"+acct+"/deposits", uuid.NewString(), `{"amount":10}`); r.status == http.StatusCreated {
		dep = r.json(t)["id"].(string)
	} else {
		t.Fatalf("deposit: %d %s", r.status, r.body)
	}
	ch := a.charge(acct, 100)
	ch2 := a.charge(acct, 50)
	r := a.post("/v1/charges/"+ch+"/refunds", uuid.NewString(), `{"amount":40}`)
	if r.status != http.StatusCreated {
		t.Fatalf("refund: %d %s", r.status, r.body)
	}
	re := r.json(t)["id"].(string)
	var eventID uuid.UUID
	if err := a.db.QueryRow(context.Background(), `SELECT id FROM events WHERE merchant_id = $1 LIMIT 1`, a.merchantID).Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	evt := payment.FormatID(payment.PrefixEvent, eventID)

	// A can read each of them: the paths are right.
	for _, path := range []string{"/v1/accounts/" + acct, "/v1/accounts/" + acct + "/deposits/" + dep,
		"/v1/charges/" + ch, "/v1/charges/" + ch + "/refunds/" + re} {
		if r := a.get(path); r.status != http.StatusOK {
			t.Fatalf("A GET %s = %d %s", path, r.status, r.body)
		}
	}
	// B's own charge, to pair with A's refund id.
	bAcct := b.account("USD", 100)
	bCh := b.charge(bAcct, 10)

	for _, c := range []struct {
		who    *fixture
		path   string
		status int
	}{
		{b, "/v1/accounts/" + acct, http.StatusNotFound},
		{b, "/v1/accounts/" + acct + "/deposits/" + dep, http.StatusNotFound},
		{b, "/v1/accounts/" + bAcct + "/deposits/" + dep, http.StatusNotFound},
		{b, "/v1/charges/" + ch, http.StatusNotFound},
		{b, "/v1/charges/" + ch + "/refunds/" + re, http.StatusNotFound},
		{b, "/v1/charges/" + bCh + "/refunds/" + re, http.StatusNotFound},
		{a, "/v1/charges/" + ch2 + "/refunds/" + re, http.StatusNotFound}, // A's refund, under A's other charge
		{b, "/v1/charges?account_id=" + acct, http.StatusNotFound},
		{b, "/v1/charges?starting_after=" + ch, http.StatusBadRequest},
		{b, "/v1/events?starting_after=" + evt, http.StatusBadRequest},
	} {
		if r := c.who.get(c.path); r.status != c.status {
			t.Errorf("GET %s = %d %s, want %d", c.path, r.status, r.body, c.status)
		}
	}

	// B's lists hold only B's items. B's events come after A's, so once the
	// feed lists B's, A's are settled too and would show if they leaked.
	if _, items := b.list("/v1/charges?limit=100"); len(items) != 1 || items[0].ID != bCh {
		t.Errorf("B's charge list = %v, want only %s", items, bCh)
	}
	const bEvents = 3 // account, deposit, charge
	var items []listItem
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, items = b.list("/v1/events?limit=100"); len(items) >= bEvents || time.Now().After(deadline) {
			break
		}
	}
	if len(items) != bEvents {
		t.Fatalf("B's event feed lists %d events after 30 s, want B's %d", len(items), bEvents)
	}
	for _, e := range items {
		var n int
		id, _ := payment.ParseID(payment.PrefixEvent, e.ID)
		if err := b.db.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE merchant_id = $1 AND id = $2`, b.merchantID, id).Scan(&n); err != nil || n != 1 {
			t.Errorf("B's feed lists event %s, which is not B's (%v)", e.ID, err)
		}
	}
}
