package webhook_test

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/webhook"
)

// TestOnDelivered: the Deliverer calls OnDelivered once for each delivery a
// 2xx answered, never for a failed attempt: here with the second attempt
// of an event whose first was answered 500, and the first of another; each
// time with the delivery (its attempt number, its body) and when the answer
// came, after the attempt began.
func TestOnDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newHookReceiver(t, func(n int) int {
		if n == 1 {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	endpoint(t, b.store, b.merchant, rcv.URL, payment.AllEvents)
	retried := event(t, b.store, b.merchant, payment.EventChargeSucceeded)
	type call struct {
		d        payment.WebhookDelivery
		answered time.Time
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	began := time.Now()
	start(t, b.store, webhook.Options{OnDelivered: func(d payment.WebhookDelivery, answered time.Time) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{d, answered})
	}})
	waitFor(t, "the first event is delivered", func() bool { return len(rcv.requests()) == 2 })
	first := event(t, b.store, b.merchant, payment.EventRefundCreated)
	waitFor(t, "the second event is delivered", func() bool { return len(rcv.requests()) == 3 })
	waitFor(t, "both deliveries are reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) >= 2 })
	time.Sleep(50 * time.Millisecond) // room for a wrong third call

	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 {
		t.Fatalf("OnDelivered called %d times for 2 deliveries: %+v", len(calls), calls)
	}
	for i, want := range []struct {
		event   string
		attempt int
	}{{retried, 2}, {first, 1}} {
		c := calls[i]
		if id := payment.FormatID(payment.PrefixEvent, c.d.EventID); id != want.event || c.d.Attempt != want.attempt || len(c.d.Body) == 0 {
			t.Errorf("call %d: event %s, attempt %d, body %q; want %s, attempt %d, its body", i+1, id, c.d.Attempt, c.d.Body, want.event, want.attempt)
		}
		if c.answered.Before(began) || c.answered.After(time.Now()) {
			t.Errorf("call %d: answered at %v, outside the test (%v to now)", i+1, c.answered, began)
		}
		var body struct {
			CreatedAt time.Time `json:"created_at"`
		}
		if err := json.Unmarshal(c.d.Body, &body); err != nil || !c.d.EventCreatedAt.Equal(body.CreatedAt) || body.CreatedAt.IsZero() {
			t.Errorf("call %d: EventCreatedAt %v, the body's created_at %v (%v); want the same", i+1, c.d.EventCreatedAt, body.CreatedAt, err)
		}
	}
}
