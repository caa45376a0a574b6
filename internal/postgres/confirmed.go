package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
)

// Reads confirm what they show.
//
// A read shows whatever its snapshot holds, and that may be a commit the
// synchronous standby does not have: one whose wait was cancelled
// (durable.go), or one a restarted primary recovered from its own log. A
// failover loses it, so a client shown it (a charge, a balance, a revoked
// key) would have been shown something that then never happened, and its
// retry would create a different charge. So a read (read) also takes, on the
// same connection and after its statements, a snapshot (snapshotSQL), which
// sees at least everything the read saw, and answers only once the standby
// is known to have every transaction that snapshot sees, or
// payment.ErrUnavailable within CommitWait.
//
// What the standby is known to have is the snapshot of the last confirmation
// round: a round takes a snapshot and then commits a transaction that waits
// for the standby (confirmSQL). A transaction's commit record is written
// before it becomes visible, so once that commit is confirmed, the standby
// has every transaction the round's snapshot saw, and the round's own.
//
// A read whose snapshot sees no transaction the round's did not (covers)
// pays only for taking it. One that sees more waits for the next round,
// which every caller waiting meanwhile shares: a burst of reads costs one
// commit, not one each. Rounds also run with no read asking, shortly after
// this process's transactions end (rounds.go): what it committed is
// confirmed before the standby can go away. A transaction still waiting for
// the standby is in progress, visible to no one, so it makes no read wait:
// while the standby is away, reads of what the last round confirmed answer
// at once (a round that waits meanwhile is such a transaction, and waits
// on), until a commit's wait is cancelled and its data becomes visible
// unconfirmed; from then on a read that sees it waits for the standby.
//
// Across a failover that loses nothing confirmed the promoted standby has
// every transaction the known snapshot saw; any transaction it sees that the
// snapshot did not, including one under a transaction id the old primary had
// used for a commit the failover lost, makes a read wait for a round there.

// snapshotSQL is what a transaction sees, as pg_snapshot's text.
const snapshotSQL = `SELECT pg_current_snapshot()::text`

// A snapshot is which transactions a snapshot sees (xmin:xmax:xip): every
// one below xmax except those in xip, still in progress when it was taken.
// own is the confirmation round's own transaction, 0 for none.
type snapshot struct {
	xmin, xmax uint64
	xip        []uint64 // ascending
	own        uint64
}

// parseSnapshot reads pg_snapshot's text, "10:20:10,14,15".
func parseSnapshot(text string) (*snapshot, error) {
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("snapshot %q: not xmin:xmax:xip", text)
	}
	var s snapshot
	var err error
	if s.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", text, err)
	}
	if s.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", text, err)
	}
	if parts[2] != "" {
		for f := range strings.SplitSeq(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("snapshot %q: %w", text, err)
			}
			s.xip = append(s.xip, x)
		}
	}
	slices.Sort(s.xip)
	return &s, nil
}

// inProgress reports whether x was in progress when s was taken.
func (s *snapshot) inProgress(x uint64) bool {
	_, found := slices.BinarySearch(s.xip, x)
	return found
}

// covers reports whether every transaction r sees, s saw (or is s's own). A
// transaction r sees and s did not is one s saw in progress, or one that
// began after s, that r finds ended (committed or aborted: an abort is
// counted too, there is no telling them apart here). The second loop ends at
// the first transaction r does not see in progress, so it runs at most
// len(r.xip)+2 times.
func (s *snapshot) covers(r *snapshot) bool {
	if s == nil {
		return false
	}
	for _, x := range s.xip {
		if x < r.xmax && !r.inProgress(x) {
			return false
		}
	}
	for x := s.xmax; x < r.xmax; x++ {
		if x != s.own && !r.inProgress(x) {
			return false
		}
	}
	return true
}

// read runs fn, a read, on one pooled connection, then waits until the
// standby is known to have everything fn could have seen. fn's error is
// returned as it is, and one that is an answer (isAnswer) only after that
// wait: it too may rest on a commit the standby lacks (a deleted endpoint's
// 404).
func (s *db) read(ctx context.Context, fn func(q querier) error) error {
	conn, release, err := s.acquireRead(ctx)
	if err != nil {
		return err
	}
	answer := fn(conn)
	if answer != nil && !isAnswer(answer) {
		release()
		return answer
	}
	var seen string
	err = conn.QueryRow(ctx, snapshotSQL).Scan(&seen)
	release()
	if err != nil {
		return asUnavailable(fmt.Errorf("take a snapshot after a read: %w", err))
	}
	return s.confirmSeen(ctx, seen, answer)
}

// readRow is read for a read of one statement, whose row scan reads: the
// statement and the snapshot after it go in one round trip.
func (s *db) readRow(ctx context.Context, scan func(pgx.Row) error, sql string, args ...any) error {
	conn, release, err := s.acquireRead(ctx)
	if err != nil {
		return err
	}
	var b pgx.Batch
	b.Queue(sql, args...)
	b.Queue(snapshotSQL)
	br := conn.SendBatch(ctx, &b)
	answer := scan(br.QueryRow())
	var seen string
	err = br.QueryRow().Scan(&seen)
	err = errors.Join(err, br.Close())
	release()
	if answer != nil && !isAnswer(answer) {
		return answer
	}
	if err != nil {
		return asUnavailable(fmt.Errorf("take a snapshot after a read: %w", err))
	}
	return s.confirmSeen(ctx, seen, answer)
}

// confirmSeen returns answer once the standby is known to have every
// transaction the snapshot seen (pg_snapshot's text) sees.
func (s *db) confirmSeen(ctx context.Context, seen string, answer error) error {
	snap, err := parseSnapshot(seen)
	if err != nil {
		return fmt.Errorf("%w: %w", payment.ErrUnavailable, err)
	}
	if !s.confirmed.known.Load().covers(snap) {
		if err := s.confirmCommitted(ctx); err != nil {
			return err
		}
	}
	return answer
}

// isAnswer reports whether err, from a read, is something to tell the
// client rather than a failure to read.
func isAnswer(err error) bool {
	var invalid *payment.ValidationError
	return errors.Is(err, payment.ErrNotFound) || errors.As(err, &invalid) || errors.Is(err, ErrUnknownMerchant)
}
