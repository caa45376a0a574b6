package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
)

// Races of captures against the clock, against refunds, and of
// authorizations against each other for the same funds.

// expireIn moves a charge's expires_at to d from the database's now (the
// controlled clock) and returns it.
func (f *fixture) expireIn(chargeID string, d time.Duration) time.Time {
	f.t.Helper()
	id, ok := payment.ParseID(payment.PrefixCharge, chargeID)
	if !ok {
		f.t.Fatalf("charge id %q", chargeID)
	}
	var at time.Time
	if err := f.db.QueryRow(context.Background(), `
UPDATE charges SET expires_at = now() + $3 * interval '1 microsecond'
WHERE merchant_id = $1 AND id = $2 RETURNING expires_at`, f.merchantID, id, d.Microseconds()).Scan(&at); err != nil {
		f.t.Fatalf("move the expiry of %s: %v", chargeID, err)
	}
	return at
}

// sweep runs the expiry sweep until it finds nothing left, and returns how
// many holds it expired.
func (f *fixture) sweep() int64 {
	f.t.Helper()
	holds := postgres.NewHolds(f.store.DB)
	var total int64
	for range 100 {
		n, ran, err := holds.ExpireHolds(context.Background(), 1000)
		if err != nil {
			f.t.Fatalf("sweep: %v", err)
		}
		if total += n; ran && n == 0 {
			return total
		}
	}
	f.t.Fatal("the sweep never finished")
	return 0
}

// sweepers runs n sweeps in a loop, in small batches, until stop is called.
func (f *fixture) sweepers(n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			holds := postgres.NewHolds(f.store.DB)
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, _, err := holds.ExpireHolds(context.Background(), 2); err != nil {
					f.t.Errorf("sweep: %v", err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// expiring is an authorization whose capture races its expiry.
type expiring struct {
	id, acct   string
	take       int64     // what its capture asks
	at         time.Time // its expires_at
	fire       time.Time // when to send its capture
	sent, done time.Time // when its capture was sent, and answered
	r          reply
}

// TestCaptureRacesExpiry fires captures at their authorizations' expiry
// instants while two sweeps run: each capture either takes its amount (200,
// no charge.expired) or is told the charge expired (409, nothing taken, one
// charge.expired once swept). A capture answered before the instant must
// have won; one sent after it must have lost.
func TestCaptureRacesExpiry(t *testing.T) {
	t.Parallel()
	// A database of its own: the sweep expires every hold it finds.
	f := setup(t, func(o *setupOptions) { o.databaseURL = pgtest.NewDatabase(t) })
	accts := []string{f.account("USD", 10_000), f.account("USD", 10_000), f.account("USD", 10_000)}
	hs := make([]*expiring, 24)
	for i := range hs {
		h := &expiring{acct: accts[i%len(accts)], take: int64(100 + i)}
		h.id = f.authorize(h.acct, 100+int64(i))
		if i%2 == 1 {
			h.take -= 50
		}
		hs[i] = h
	}
	// Four expired already, four an hour away, the others 10 ms apart
	// from 300 ms on: those race, their captures sent from 30 ms before
	// the instant to 5 ms after.
	for i, h := range hs {
		switch {
		case i < 4:
			h.at = f.expireIn(h.id, -time.Second)
		case i < 8:
			h.at = f.expireIn(h.id, time.Hour)
		default:
			h.at = f.expireIn(h.id, 300*time.Millisecond+time.Duration(i)*10*time.Millisecond)
			h.fire = h.at.Add(time.Duration(i%8-6) * 5 * time.Millisecond) // a capture takes some ms
		}
	}
	stop := f.sweepers(2)
	f.captureAtExpiry(hs)
	stop()
	f.sweep()

	events := f.chargeEvents()
	taken := map[string]int64{}
	won := 0
	for i, h := range hs {
		switch h.r.status {
		case http.StatusOK:
			won++
			taken[h.acct] += h.take
			if c := h.r.json(t); c["status"] != "succeeded" || c["amount_captured"] != float64(h.take) {
				t.Errorf("capture %d: %s", i, h.r.body)
			}
			if h.sent.After(h.at) {
				t.Errorf("capture %d sent %v after its expiry won", i, h.sent.Sub(h.at))
			}
			wantEvents(t, events, h.id, map[string]int{"charge.authorized": 1, "charge.captured": 1})
		default:
			wantRefused(t, h.r, http.StatusConflict, "charge-not-capturable", "expired")
			if h.done.Before(h.at) {
				t.Errorf("capture %d answered %v before its expiry lost", i, h.at.Sub(h.done))
			}
			wantEvents(t, events, h.id, map[string]int{"charge.authorized": 1, "charge.expired": 1})
		}
		if i < 4 && h.r.status == http.StatusOK || i >= 4 && i < 8 && h.r.status != http.StatusOK {
			t.Errorf("capture %d of a hold far from its expiry: %d %s", i, h.r.status, h.r.body)
		}
		want := map[bool]string{true: "succeeded", false: "expired"}[h.r.status == http.StatusOK]
		if c := f.get("/v1/charges/" + h.id).json(t); c["status"] != want {
			t.Errorf("charge %d after the race: %v, want %s", i, c, want)
		}
	}
	t.Logf("%d of the 16 racing captures won", won-4)
	for _, a := range accts {
		f.wantMoney(a, 10_000-taken[a], 10_000-taken[a])
	}
	if n := f.count(`SELECT count(*) FROM accounts WHERE merchant_id = $1 AND held <> 0`); n != 0 {
		t.Errorf("%d accounts hold something after every hold ended", n)
	}
	if n := f.count(`SELECT count(*) FROM charges WHERE merchant_id = $1 AND status = 'authorized'`); n != 0 {
		t.Errorf("%d charges still stored authorized after the sweep", n)
	}
}

// captureAtExpiry sends each hold's capture at its fire time (at once if
// zero), all released by one barrier.
func (f *fixture) captureAtExpiry(hs []*expiring) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Go(func() {
			c := call{"/v1/charges/" + h.id + "/capture", uuid.NewString(), ""}
			if h.take%2 == 1 {
				c.body = fmt.Sprintf(`{"amount":%d}`, h.take)
			}
			<-start
			time.Sleep(time.Until(h.fire))
			h.sent = time.Now()
			h.r = f.definite(c, f.post(c.path, c.key, c.body))
			h.done = time.Now()
		})
	}
	close(start)
	wg.Wait()
}
