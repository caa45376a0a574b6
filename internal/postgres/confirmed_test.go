package postgres

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// TestSnapshotCovers: a read waits for a round exactly when its snapshot
// sees a transaction the known one did not.
func TestSnapshotCovers(t *testing.T) {
	known := &snapshot{xmin: 100, xmax: 110, xip: []uint64{100, 105}, own: 111}
	for _, tc := range []struct {
		read string
		want bool
	}{
		{"100:110:100,105", true},         // nothing ended since
		{"90:100:90", true},               // an older snapshot
		{"100:112:100,105,110", true},     // 110 began and is in progress, 111 is the round's own
		{"100:113:100,105,110", false},    // 112 began and ended
		{"100:112:100,110", false},        // 105 ended: it may have committed
		{"106:112:106,110", false},        // 100 and 105 ended
		{"100:111:100,105", false},        // 110 began and ended
		{"110:111:110", false},            // everything k saw in progress ended
		{"100:112:100,105,110,111", true}, // the round's own, still listed in progress
	} {
		read, err := parseSnapshot(tc.read)
		if err != nil {
			t.Fatal(err)
		}
		if got := known.covers(read); got != tc.want {
			t.Errorf("%v covers %s = %v, want %v", known, tc.read, got, tc.want)
		}
	}
	if (*snapshot)(nil).covers(&snapshot{xmin: 1, xmax: 1}) {
		t.Error("no known snapshot covers a read")
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:3,x"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("parseSnapshot(%q) = nil error", bad)
		}
	}
}

// TestReadsAnswerConfirmed: once a read returns, the confirmed snapshot
// covers everything committed before it began, for reads released at once,
// a 404 among them; and one confirmation round serves them.
func TestReadsAnswerConfirmed(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.NewDatabase(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	merchant := payment.NewID()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO merchants (id, name) VALUES ($1, 'acme')`, merchant); err != nil {
		t.Fatal(err)
	}
	var text string
	if err := s.Pool().QueryRow(ctx, snapshotSQL).Scan(&text); err != nil {
		t.Fatal(err)
	}
	before, err := parseSnapshot(text)
	if err != nil {
		t.Fatal(err)
	}
	const readers = 32
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		errs  = make(chan error, readers)
	)
	for range readers {
		wg.Go(func() {
			<-start
			if _, err := s.Account(ctx, merchant, uuid.New()); !errors.Is(err, payment.ErrNotFound) {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("read of an account the merchant lacks: %v, want payment.ErrNotFound", err)
	}
	if known := s.DB.confirmed.known.Load(); !known.covers(before) {
		t.Fatalf("after the reads the confirmed snapshot %v does not cover %v, taken before them", known, before)
	}
	t.Logf("%d reads, %d confirmation rounds", readers, s.DB.confirmed.rounds.Load())
	if n := s.DB.confirmed.rounds.Load(); n < 1 || n > readers {
		t.Errorf("%d confirmation rounds for %d reads, want 1..%d", n, readers, readers)
	}
}
