package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/testkit"
	"github.com/exactlyonce/payments/internal/webhook"
)

// hangingReceiver is a webhook endpoint that answers 204 until it hangs:
// then it holds every request until it answers again (and answers them
// 204) or the Deliverer gives up on it (its 10 s timeout). It records the
// events it answered.
type hangingReceiver struct {
	*httptest.Server
	mu        sync.Mutex
	hanging   chan struct{} // closed when the receiver answers again; nil while it answers
	delivered map[string]bool
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	r := &hangingReceiver{delivered: map[string]bool{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		hanging := r.hanging
		r.mu.Unlock()
		if hanging != nil {
			select {
			case <-hanging:
			case <-req.Context().Done():
				return
			}
		}
		r.mu.Lock()
		r.delivered[req.Header.Get(webhook.EventIDHeader)] = true
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

// hang makes the receiver hold every request; answer ends that.
func (r *hangingReceiver) hang() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hanging = make(chan struct{})
}

func (r *hangingReceiver) answer() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.hanging)
	r.hanging = nil
}

func (r *hangingReceiver) answered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.delivered)
}

// watched is serve run for real with METRICS_SAMPLE=1s, a merchant, and its
// endpoint for account.created on rcv.
type watched struct {
	*stack
	db      string
	rcv     *hangingReceiver
	created int // events created, each to be delivered
}

func startWatched(t *testing.T) *watched {
	t.Helper()
	db := pgtest.NewDatabase(t)
	merchant := createMerchant(t, db)
	logs := &testkit.LogBuffer{}
	env := envOf(map[string]string{"DATABASE_URL": db, "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0",
		"METRICS_SAMPLE": "1s", "RELAY_ENABLED": "false", "SHUTDOWN_DELAY": "0", "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true"})
	runUntilCleanup(t, "serve", env, logs)
	w := &watched{db: db, rcv: newHangingReceiver(t), stack: &stack{t: t, api: waitForAddr(t, logs),
		scrape: map[string]string{"serve": waitForMetricsAddr(t, logs)}, apiKey: merchant.APIKey, logs: logs}}
	if status, body := w.post("/v1/webhook_endpoints", uuid.NewString(),
		`{"url":"`+w.rcv.URL+`/hook","events":["account.created"]}`); status != http.StatusCreated {
		t.Fatalf("create the endpoint: %d %s", status, body)
	}
	return w
}

// openAccounts opens n accounts: n account.created events.
func (w *watched) openAccounts(n int) {
	w.t.Helper()
	for range n {
		if status, body := w.post("/v1/accounts", uuid.NewString(), `{"currency":"USD"}`); status != http.StatusCreated {
			w.t.Fatalf("create an account: %d %s", status, body)
		}
		w.created++
	}
}

// nextSample waits for a sample begun after the call, and returns the
// scrape that shows it.
func (w *watched) nextSample() string {
	w.t.Helper()
	before, _ := sampleValue(w.metrics("serve"), "payments_outbox_samples_total")
	var text string
	waitUntil(w.t, "the next sample", func() bool {
		text = w.metrics("serve")
		n, _ := sampleValue(text, "payments_outbox_samples_total")
		return n >= before+2 // the one running may have begun before the call
	})
	return text
}

// value is series's value in a scrape of serve.
func (w *watched) value(text, series string) float64 {
	w.t.Helper()
	v, ok := sampleValue(text, series)
	if !ok {
		w.t.Fatalf("serve's /metrics lacks %s", series)
	}
	return v
}

// TestWebhookBacklogSeenAndAlerted runs serve for real (METRICS_SAMPLE=1s)
// with an endpoint whose receiver answers, then hangs, then answers again:
//   - while it answers, its events arrive and the delivery-lag histogram
//     counts them as first attempts; nothing is due;
//   - while it hangs, the due-deliveries gauge rises with every event
//     created, and PaymentsWebhookBacklogGrowing's expression holds over
//     those scrapes (one scrape standing for a minute); the overdue gauge
//     grows in real time, and once every pending delivery's due time is moved
//     20 minutes back (the test cannot wait 10 minutes),
//     PaymentsWebhookDeliveryOverdue's expression holds too;
//   - once it answers again, every event arrives, the gauges fall back to 0,
//     neither expression holds, and the histogram counts each delivery once,
//     those whose first attempt timed out under retry.
func TestWebhookBacklogSeenAndAlerted(t *testing.T) {
	t.Parallel()
	rules := newRuleEvaluator(t)
	w := startWatched(t)
	const due, overdue = "payments_webhook_due_deliveries", "payments_webhook_overdue_seconds"

	w.openAccounts(3)
	waitUntil(t, "3 events answered", func() bool { return w.rcv.answered() == 3 })
	text := w.nextSample()
	if d, o := w.value(text, due), w.value(text, overdue); d != 0 || o != 0 {
		t.Errorf("with every event delivered: %v due, the oldest %v s overdue; want 0 and 0", d, o)
	}
	if n := w.value(text, `payments_webhook_delivery_lag_seconds_count{attempt="first"}`); n != 3 {
		t.Errorf("the lag histogram counts %v first attempts, want 3", n)
	}

	w.rcv.hang()
	var scrapes []string
	for range 20 {
		w.openAccounts(8)
		scrapes = append(scrapes, w.nextSample())
	}
	first, last := w.value(scrapes[0], due), w.value(scrapes[len(scrapes)-1], due)
	if first <= 0 || last < 100 || last <= first {
		t.Errorf("the due deliveries went from %v to %v while 160 events waited for a receiver that hangs; want a rise past 100", first, last)
	}
	rules.check(t, "PaymentsWebhookBacklogGrowing", scrapes, true)
	if o := w.value(scrapes[len(scrapes)-1], overdue); o < 5 || o > 600 {
		t.Errorf("after 20 s of a receiver that hangs, the oldest due delivery is %v s overdue; want seconds", o)
	}
	rules.check(t, "PaymentsWebhookDeliveryOverdue", scrapes, false)
	moveDueTimesBack(t, w.db, 20*time.Minute)
	text = w.nextSample()
	if o := w.value(text, overdue); o < 20*60 {
		t.Errorf("with due times moved 20 minutes back, the oldest due delivery is %v s overdue", o)
	}
	scrapes = append(scrapes, text)
	rules.check(t, "PaymentsWebhookDeliveryOverdue", scrapes, true)

	w.rcv.answer()
	waitUntil(t, "every event answered", func() bool { return w.rcv.answered() == w.created })
	text = w.waitForValue("serve", due, 0)
	if o := w.value(text, overdue); o != 0 {
		t.Errorf("with every event delivered, the oldest due delivery is %v s overdue, want 0", o)
	}
	scrapes = append(scrapes, text)
	rules.check(t, "PaymentsWebhookBacklogGrowing", scrapes, false)
	rules.check(t, "PaymentsWebhookDeliveryOverdue", scrapes, false)
	firsts := w.value(text, `payments_webhook_delivery_lag_seconds_count{attempt="first"}`)
	retries := w.value(text, `payments_webhook_delivery_lag_seconds_count{attempt="retry"}`)
	if int(firsts+retries) != w.created || retries == 0 {
		t.Errorf("the lag histogram counts %v first attempts and %v retries for %d events delivered once each, some after a timeout",
			firsts, retries, w.created)
	}
}

// moveDueTimesBack moves the due time of every pending delivery back by d,
// as if they had waited that much longer.
func moveDueTimesBack(t *testing.T, db string, d time.Duration) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE webhook_deliveries SET next_attempt_at = next_attempt_at - $1::interval
WHERE state = 'pending'`, d); err != nil {
		t.Fatal(err)
	}
}

// waitUntil polls cond until it holds, failing the test after a generous
// bound.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// TestWebhookBacklogRuleKnowsTheBound: PaymentsWebhookBacklogGrowing keeps
// firing at the due deliveries' bound, where the count can no longer rise:
// its expression names the bound the sampler counts up to.
func TestWebhookBacklogRuleKnowsTheBound(t *testing.T) {
	expr := ruleQueries(t, alertsFile)[alertsFile+": PaymentsWebhookBacklogGrowing"]
	if want := ">= " + strconv.Itoa(postgres.DueCountBound); !strings.Contains(expr, want) {
		t.Errorf("PaymentsWebhookBacklogGrowing's expression lacks %q, the bound of payments_webhook_due_deliveries:\n%s", want, expr)
	}
}
