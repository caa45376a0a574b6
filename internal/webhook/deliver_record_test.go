package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/testkit/webhooktest"
	"github.com/exactlyonce/payments/internal/webhook"
)

// outageStore is the real store, with RecordAttempts failing as a failover
// makes it fail: its first refuse calls fail without reaching the database,
// and then, if lose is set, one call commits but its answer is lost.
type outageStore struct {
	webhook.Store
	mu     sync.Mutex
	refuse int
	lose   bool
	calls  int
}

func (s *outageStore) RecordAttempts(ctx context.Context, outcomes []payment.WebhookOutcome) ([]string, error) {
	s.mu.Lock()
	s.calls++
	refuse, lose := s.refuse > 0, s.refuse == 0 && s.lose
	if refuse {
		s.refuse--
	} else {
		s.lose = false
	}
	s.mu.Unlock()
	if refuse {
		return nil, fmt.Errorf("%w: connection refused (test)", payment.ErrUnavailable)
	}
	states, err := s.Store.RecordAttempts(ctx, outcomes)
	if lose && err == nil {
		return nil, fmt.Errorf("%w: the commit's answer was lost (test)", payment.ErrUnavailable)
	}
	return states, err
}

// TestAttemptRecordedThroughAnOutage: an attempt made while the database
// fails (3 refused calls, then a commit whose answer is lost) is recorded
// once it answers, exactly once, and settles its delivery: the receiver gets
// the event once, not again when the lease ends (6 s here).
func TestAttemptRecordedThroughAnOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newHookReceiver(t, always(http.StatusNoContent))
	e := endpoint(t, b.store, b.merchant, rcv.URL, payment.AllEvents)
	id := event(t, b.store, b.merchant, payment.EventChargeSucceeded)
	store := &outageStore{Store: b.store, refuse: 3, lose: true}
	start(t, store, webhook.Options{Timeout: time.Second})

	waitFor(t, "the delivery is settled", func() bool {
		var state string
		err := b.store.Pool().QueryRow(context.Background(),
			`SELECT state FROM webhook_deliveries WHERE endpoint_id = $1`, e.ID).Scan(&state)
		return err == nil && state == payment.DeliveryDelivered
	})
	time.Sleep(7 * time.Second) // past the lease: a delivery it still held would be sent again
	if ids := eventIDs(rcv.requests()); !slices.Equal(ids, []string{id}) {
		t.Errorf("requests %v, want %s once", ids, id)
	}
	if a := webhooktest.Attempts(t, b.store.Pool(), e.ID); !slices.Equal(a, []webhooktest.Attempt{{Status: 204}}) {
		t.Errorf("attempts %v, want one 204", a)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.calls != 5 {
		t.Errorf("RecordAttempts called %d times, want 5 (3 refused, 1 answer lost, 1 more)", store.calls)
	}
}
