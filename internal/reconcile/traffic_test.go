package reconcile_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/testkit/procsimtest"
)

func TestMain(m *testing.M) { procsimtest.Main(m) }

// shop is the service in process, charging cards at a real simulator that
// fails a share of its answers at random.
type shop struct {
	api       *testkit.API
	dbURL     string
	sim       *procsimtest.Sim
	processor namedRecords
	methods   []string // the test payment methods traffic cycles through
	client    *http.Client
}

// namedRecords is a processor's records and its name.
type namedRecords interface {
	processor.Records
	Name() string
}

// startShop starts the simulator (its decision deadline 4 s, faults at
// faultRate with a fixed seed) and the service charging cards there, with
// short bounds so that recovery ends within the test.
func startShop(t *testing.T, faultRate string) *shop {
	t.Helper()
	const deadline = 4 * time.Second
	sim := procsimtest.Start(t, "-decision-deadline", deadline.String(), "-fault-rate", faultRate, "-fault-seed", "45")
	// Keep-alives off: Go's client would send a keyed request again by
	// itself on a reused connection that closed, hiding a lost answer.
	p := processor.NewSimulator(sim.URL(), &http.Client{Transport: &http.Transport{DisableKeepAlives: true}})
	o := cards.Options{Processor: p, CallTimeout: 2 * time.Second, DecisionDeadline: deadline, Wait: 800 * time.Millisecond,
		Interval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
		Poll: 20 * time.Millisecond, KeyWait: 3 * time.Second}
	dbURL := pgtest.NewDatabase(t)
	api := testkit.StartAPI(t, dbURL, testkit.APIOptions{Cards: &o})
	methods := []string{"pm_card_approve", "pm_card_decline_insufficient_funds", "pm_card_approve_lose_response",
		"pm_card_5xx_after", "pm_card_5xx_before", "pm_card_slow", "pm_card_async_pending", "pm_card_approve",
		"pm_card_approve_answer_late", "pm_card_approve"}
	return &shop{api: api, dbURL: dbURL, sim: sim, processor: p, methods: methods, client: &http.Client{Timeout: 30 * time.Second}}
}

// post sends body to path under key until it is answered with something
// other than a 5xx or a 409 (a retry with the same key never charges
// twice), and returns the status and the charge's id and status.
func (s *shop) post(t *testing.T, path, key, body string) (status int, id, chargeStatus string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequest(http.MethodPost, s.api.URL+path, strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, "", ""
		}
		req.Header.Set("Authorization", "Bearer "+s.api.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := s.client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 && resp.StatusCode != http.StatusConflict {
				var v struct {
					ID       string `json:"id"`
					ChargeID string `json:"charge_id"`
					Status   string `json:"status"`
				}
				_ = json.Unmarshal(b, &v)
				return resp.StatusCode, v.ID + v.ChargeID, v.Status
			}
		}
		if attempt == 50 {
			t.Errorf("POST %s under %s: no final answer after %d attempts", path, key, attempt)
			return 0, "", ""
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// charged is a charge the traffic made, as its client was answered.
type charged struct {
	id, status, method string
	refunded           bool
}

// traffic charges n cards, 8 at a time, cycling through the shop's test
// methods (at the simulator: approvals, declines, lost, late, failed and
// slow answers, decisions made later), some with capture false then
// captured in part, some refunded in part; each client retries with its key
// until answered.
func (s *shop) traffic(t *testing.T, n int) []charged {
	t.Helper()
	methods := s.methods
	out := make([]charged, n)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i] = s.one(t, i, methods[i%len(methods)])
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return out
}

// one is the i-th charge of the traffic, and what follows it.
func (s *shop) one(t *testing.T, i int, method string) charged {
	capture := i%4 != 1
	status, id, st := s.post(t, "/v1/charges", fmt.Sprintf("k-%d", i),
		fmt.Sprintf(`{"payment_method": %q, "amount": 1000, "currency": "EUR", "capture": %t}`, method, capture))
	c := charged{id: id, status: st, method: method}
	if status != http.StatusCreated {
		return c
	}
	switch {
	case st == "authorized" && i%8 == 5: // left authorized
	case st == "authorized":
		s.post(t, "/v1/charges/"+id+"/capture", fmt.Sprintf("k-%d-capture", i), `{"amount": 600}`)
	case i%3 == 0:
		s.post(t, "/v1/charges/"+id+"/refunds", fmt.Sprintf("k-%d-refund", i), `{"amount": 300}`)
		c.refunded = true
	}
	return c
}

// settle waits until no operation is open: every charge, capture and
// refund is final (or in review).
func (s *shop) settle(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var open int
		if err := s.api.DB.QueryRow(t.Context(),
			`SELECT count(*) FROM processor_operations WHERE state IN ('processing', 'reversing')`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d operations still open after %v", open, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
