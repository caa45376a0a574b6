package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// eventIDs reads the ids of the events left, in feed order.
func eventIDs(t *testing.T, s *Store) []uuid.UUID {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `SELECT id FROM events ORDER BY tx_id, seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestPruneGoesPastSparedEvents: the oldest events, more than a batch of
// them, are spared for a live endpoint of one merchant (pending deliveries,
// then events it has yet to fan out); another merchant's aged events behind
// them are pruned all the same, in one pass (the calls until the last says
// no more), and the spared ones stay with their deliveries pending. A young
// event ends the pass, and an aged one the relay has not published stays. The
// next pass starts again from the oldest.
func TestPruneGoesPastSparedEvents(t *testing.T) {
	const batch = 2
	ctx := context.Background()
	s := openStore(t, pgtest.NewDatabase(t))
	acme, globex := newMerchant(t, s, "acme"), newMerchant(t, s, "globex")
	addEndpoint(t, s, acme, payment.AllEvents)
	var spared []uuid.UUID // acme's: 5 with a pending delivery, then 3 not fanned out
	for range 5 {
		spared = append(spared, addEvent(t, s, acme, payment.EventChargeSucceeded))
	}
	if n, err := created(s.FanOut(ctx, 100)); err != nil || n != 5 {
		t.Fatalf("FanOut = %d, %v; want 5", n, err)
	}
	for range 3 {
		spared = append(spared, addEvent(t, s, acme, payment.EventChargeSucceeded))
	}
	var aged []uuid.UUID // globex's, the last one in a batch with the young one
	for range 3 {
		aged = append(aged, addEvent(t, s, globex, payment.EventChargeSucceeded))
	}
	young := addEvent(t, s, globex, payment.EventChargeSucceeded)
	agedBehindYoung := addEvent(t, s, globex, payment.EventChargeSucceeded)
	unpublished := addEvent(t, s, globex, payment.EventChargeSucceeded)
	if _, err := s.Pool().Exec(ctx, `UPDATE events SET created_at = now() - interval '31 days' WHERE id <> $1`, young); err != nil {
		t.Fatal(err)
	}

	lease, err := s.ClaimOutbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	events, err := lease.Unpublished(ctx, 100)
	if err != nil || len(events) != 14 {
		t.Fatalf("Unpublished = %d events, %v; want 14", len(events), err)
	}
	if err := lease.MarkPublished(ctx, events[:13]); err != nil { // all but the last
		t.Fatal(err)
	}

	const retention = 30 * 24 * time.Hour
	pass := func() (deleted int64, calls int) {
		t.Helper()
		for {
			n, more, err := lease.Prune(ctx, retention, batch)
			if err != nil {
				t.Fatal(err)
			}
			deleted, calls = deleted+n, calls+1
			if !more || calls > 100 {
				return deleted, calls
			}
		}
	}
	if n, calls := pass(); n != 3 {
		t.Errorf("a pass in batches of %d deleted %d events in %d calls, want globex's 3 aged ones", batch, n, calls)
	}
	want := append(slices.Clone(spared), young, agedBehindYoung, unpublished)
	if got := eventIDs(t, s); !slices.Equal(got, want) {
		t.Errorf("events left %v,\nwant %v (acme's spared, globex's young one and those after it); pruned: %v", got, want, aged)
	}
	var pending int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`).Scan(&pending); err != nil || pending != 5 {
		t.Errorf("%d deliveries pending (%v), want acme's 5", pending, err)
	}

	// The young event ages: the next pass starts from the oldest again and
	// gets to the aged one behind it.
	if _, err := s.Pool().Exec(ctx, `UPDATE events SET created_at = now() - interval '31 days' WHERE id = $1`, young); err != nil {
		t.Fatal(err)
	}
	if n, calls := pass(); n != 2 {
		t.Errorf("the next pass deleted %d events in %d calls, want 2 (the one that aged and the one behind it)", n, calls)
	}
	if got, want := eventIDs(t, s), append(slices.Clone(spared), unpublished); !slices.Equal(got, want) {
		t.Errorf("events left %v, want %v", got, want)
	}
}
