package clienttest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/exactlyonce/payments/client"
)

// TestEventsAndGetEvent: Events pages through the whole feed (a page of one
// event at a time here), and GetEvent reads each event it yields back, the
// same id, type, time and data, byte for byte. An event the merchant does
// not have is a *Problem not-found, answered once and not retried.
func TestEventsAndGetEvent(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	c := f.client(f.url)
	acct := f.fundedAccount(1_000)
	if _, err := c.CreateCharge(ctx, client.NewCharge{AccountID: acct.ID, Amount: 250, Currency: "USD"}); err != nil {
		t.Fatal(err)
	}
	f.waitForEvents(c, map[client.EventType]int{
		client.EventTypeAccountCreated: 1, client.EventTypeDepositCreated: 1, client.EventTypeChargeSucceeded: 1,
	})

	one := 1
	var types []client.EventType
	for e, err := range c.Events(ctx, client.ListEventsParams{Limit: &one}) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, e.Type)
		got, err := c.GetEvent(ctx, e.ID)
		if err != nil {
			t.Fatalf("GetEvent(%s): %v", e.ID, err)
		}
		listed, _ := json.Marshal(e.Data)
		read, _ := json.Marshal(got.Data.Data)
		if got.StatusCode != http.StatusOK || got.Data.ID != e.ID || got.Data.Type != e.Type ||
			!got.Data.CreatedAt.Equal(e.CreatedAt) || got.Data.Object != e.Object || !bytes.Equal(read, listed) {
			t.Errorf("GetEvent(%s) = %d %+v, data %s; the feed lists %+v, data %s", e.ID, got.StatusCode, got.Data, read, e, listed)
		}
	}
	want := []client.EventType{client.EventTypeAccountCreated, client.EventTypeDepositCreated, client.EventTypeChargeSucceeded}
	if len(types) != len(want) || types[0] != want[0] || types[1] != want[1] || types[2] != want[2] {
		t.Errorf("Events yielded %v, want %v (oldest first)", types, want)
	}

	res, err := c.GetEvent(ctx, "evt_"+strings.Repeat("0", 32))
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Code != client.CodeNotFound || prob.Status != http.StatusNotFound || res.Attempts != 1 {
		t.Errorf("GetEvent of an unknown event: %v (%d attempts), want not-found at once", err, res.Attempts)
	}
}
