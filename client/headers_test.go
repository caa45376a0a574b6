package client

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRequestsSayWhoSendsThem: every request carries the client's
// User-Agent, and a caller's own X-Request-Id (the params' XRequestID) is
// the one sent, not dropped for a generated one.
func TestRequestsSayWhoSendsThem(t *testing.T) {
	var (
		mu      sync.Mutex
		agents  []string
		reqIDs  []string
		answers = map[string]string{
			"/v1/charges": `{"object":"list","data":[],"has_more":false}`,
			"/v1/events":  `{"object":"list","data":[],"has_more":false}`,
		}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents, reqIDs = append(agents, r.Header.Get("User-Agent")), append(reqIDs, r.Header.Get("X-Request-Id"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		fmt.Fprint(w, answers[r.URL.Path])
	}))
	defer srv.Close()
	c := New(srv.URL, "sk_test")
	mine := "order-1001-list"
	if _, err := c.ListCharges(context.Background(), ListChargesParams{XRequestID: &mine}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListEvents(context.Background(), ListEventsParams{}); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if !strings.HasPrefix(a, "payments-go/") {
			t.Errorf("User-Agent %q, want payments-go/...", a)
		}
	}
	if reqIDs[0] != mine || !strings.HasPrefix(reqIDs[1], "req_") {
		t.Errorf("request ids %q, want the caller's %q, then a generated one", reqIDs, mine)
	}
}

// TestAnAttemptIsBoundedWithinTheBudget: by default one attempt may not take
// the whole retry budget (MaxElapsed): a hung attempt leaves room to retry.
func TestAnAttemptIsBoundedWithinTheBudget(t *testing.T) {
	c := New("http://127.0.0.1:1", "sk_test")
	if c.http.Timeout <= 0 || c.http.Timeout*2 > DefaultRetryPolicy.MaxElapsed {
		t.Errorf("an attempt's timeout %v, want at most half the budget %v", c.http.Timeout, DefaultRetryPolicy.MaxElapsed)
	}
}

// TestEventsIteratesTheFeed: Events pages through the feed, oldest first,
// until a page says no more follow.
func TestEventsIteratesTheFeed(t *testing.T) {
	pages := map[string]string{
		"":      `{"object":"list","data":[{"id":"evt_1","object":"event","type":"account.created"},{"id":"evt_2","object":"event","type":"deposit.created"}],"has_more":true}`,
		"evt_2": `{"object":"list","data":[{"id":"evt_3","object":"event","type":"charge.succeeded"}],"has_more":false}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, pages[r.URL.Query().Get("starting_after")])
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []string
	for e, err := range New(srv.URL, "sk_test").Events(ctx, ListEventsParams{}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	if strings.Join(ids, ",") != "evt_1,evt_2,evt_3" {
		t.Errorf("events %v, want evt_1, evt_2, evt_3", ids)
	}
}
