package postgres

import (
	"context"
	"testing"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// created is FanOut's count of deliveries created, for the tests that
// count them.
func created(r payment.FanOut, err error) (int, error) { return r.Created, err }

// TestFanOutAgainWhileEventsWaitAboveTheHorizon: an event committed while an
// older transaction still runs is above the event horizon, so a fan-out
// skips it, and asks to be called again; once that transaction ends, the
// next fan-out delivers it and asks for nothing more. Events of a merchant
// without a live endpoint waiting there ask for nothing. Without any
// endpoint at all, a fan-out says it is idle.
func TestFanOutAgainWhileEventsWaitAboveTheHorizon(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	addEvent(t, s, acme, payment.EventAccountCreated)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Idle: true}) {
		t.Errorf("FanOut without any endpoint = %+v, %v; want idle", r, err)
	}
	addEndpoint(t, s, acme, payment.AllEvents)

	older, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx) // a no-op once committed below
	if _, err := older.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	addEvent(t, s, globex, payment.EventAccountCreated)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{}) {
		t.Errorf("FanOut with only globex's event above the horizon = %+v, %v; want nothing, not again", r, err)
	}
	addEvent(t, s, acme, payment.EventAccountCreated)
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Again: true}) {
		t.Errorf("FanOut with acme's event above the horizon = %+v, %v; want none created, again", r, err)
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := s.FanOut(ctx, 100); err != nil || r != (payment.FanOut{Created: 1, Again: false}) {
		t.Errorf("FanOut once the older transaction ended = %+v, %v; want 1 created, not again", r, err)
	}
}

// TestWatchEvents: every watcher receives after events commit, a burst of
// commits leaves one signal pending, and an ended watch receives nothing.
func TestWatchEvents(t *testing.T) {
	s := openStore(t, pgtest.NewDatabase(t))
	first, unwatchFirst := s.WatchEvents()
	second, unwatchSecond := s.WatchEvents()
	defer unwatchSecond()
	s.DB.eventsCommitted()
	s.DB.eventsCommitted()
	for name, c := range map[string]<-chan struct{}{"first": first, "second": second} {
		if len(c) != 1 {
			t.Errorf("%s watcher holds %d signals after two commits, want 1", name, len(c))
		}
		<-c
	}
	unwatchFirst()
	s.DB.eventsCommitted()
	if len(first) != 0 || len(second) != 1 {
		t.Errorf("after the first watch ended: first holds %d, second %d; want 0 and 1", len(first), len(second))
	}
}
