package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/postgres"
)

// TestReadsLeaveHalfThePoolToWrites: reads hold at most half the pool's
// connections, so that with every read's connection taken (many merchants
// reading at once) a read waits and answers 503 within AcquireWait, and the
// writes still get the other half at once.
func TestReadsLeaveHalfThePoolToWrites(t *testing.T) {
	ctx := context.Background()
	const wait = 300 * time.Millisecond
	s, err := postgres.Open(ctx, pgtest.DatabaseURL(t), postgres.Options{MaxConns: 4, AcquireWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if got := s.ReadSlots(); got != 2 {
		t.Fatalf("%d read slots in a pool of 4, want 2", got)
	}
	merchant, _, err := s.RegisterMerchant(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	release := s.TakeReadSlots(2)
	began := time.Now()
	_, err = s.Account(ctx, merchant, uuid.New())
	took := time.Since(began)
	if !errors.Is(err, payment.ErrUnavailable) || took < wait {
		t.Fatalf("a read with every read slot taken: %v after %s, want unavailable after %s", err, took, wait)
	}
	// The other half of the pool is the writes': two at once, now.
	conns := make([]func(), 2)
	for i := range conns {
		c, err := s.DB.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.Release
	}
	for _, r := range conns {
		r()
	}
	if _, _, err := s.RegisterMerchant(ctx, t.Name()+"-2"); err != nil {
		t.Errorf("a write with every read slot taken: %v", err)
	}
	release()
	if _, err := s.Account(ctx, merchant, uuid.New()); !errors.Is(err, payment.ErrNotFound) {
		t.Errorf("a read once the slots are free: %v, want not found", err)
	}
}
