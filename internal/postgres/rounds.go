package postgres

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// Confirmation rounds (what they confirm: confirmed.go) run one at a time,
// on a goroutine and a connection of their own (confirmRounds), from Connect
// to Close: at once when a read waits for one, and confirmEvery after a
// transaction of this process ended, so that what it committed is confirmed
// before a read asks, and before the standby can go away.
//
// A round waits for the standby as long as it takes. One cut short would
// commit its transaction on the primary alone (durable.go), and every read,
// of every replica, that saw that transaction would then wait for the
// standby too, whatever it read. While one waits, no other starts; a read
// that needs a round answers payment.ErrUnavailable after CommitWait, and
// the waiting round holds one connection, not one per read. Close ends it.
// A server that no longer answers at all (its host gone) is noticed by TCP
// keepalives (roundKeepAlive), and the next round connects again.

// confirmEvery is how long after a transaction of this process ended the
// round that confirms it starts: the transactions ending meanwhile share it,
// so busy, rounds cost a small commit per confirmEvery; idle, nothing.
const confirmEvery = 50 * time.Millisecond

// roundKeepAlive probes the rounds' connection while it is idle, above all
// while a round waits for the standby: a server that stops answering the
// probes (its host gone, the network cut) is given up within about 11 s.
var roundKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}

// confirmer runs the confirmation rounds of one store and remembers the
// last one's snapshot.
type confirmer struct {
	known  atomic.Pointer[snapshot] // nil until a round succeeded
	rounds atomic.Int64             // rounds that committed, for the tests
	// txSQL is what a round runs: confirmTxSQL, or a test's stand-in for a
	// synchronous standby (rounds_test.go).
	txSQL string

	// ended and asked, each with a buffer of one, wake the loop: a
	// transaction ended (transactionEnded), a caller waits for next
	// (nextRound). done is closed when the loop has returned.
	ended, asked, done chan struct{}
	// conn is the rounds' connection, nil until the next round connects;
	// the loop's alone.
	conn *pgx.Conn

	mu      sync.Mutex
	next    *round // the round that starts after the current one; nil if none is wanted
	stopped bool   // the loop has returned: no round starts any more
}

// A round is one confirmation: once done is closed, err says whether
// everything committed before it started is on the standby.
type round struct {
	done chan struct{}
	err  error
}

// errClosed answers the callers of a round that will not run.
var errClosed = fmt.Errorf("%w: the store is closed", payment.ErrUnavailable)

// transactionEnded tells the rounds that a transaction of this process,
// which may have written, ended, committed or not (an aborted transaction
// too makes a read wait: covers): a round follows within confirmEvery. It
// never blocks.
func (s *db) transactionEnded() {
	select {
	case s.confirmed.ended <- struct{}{}:
	default:
	}
}

// confirmCommitted returns once everything committed before it was called
// is on the synchronous standby, if there is one, or payment.ErrUnavailable
// when that is not known within CommitWait. Callers at once share a round.
func (s *db) confirmCommitted(ctx context.Context) error {
	r := s.nextRound()
	t := time.NewTimer(s.opts.CommitWait)
	defer t.Stop()
	select {
	case <-r.done:
		return r.err
	case <-t.C:
		return fmt.Errorf("%w: commits not confirmed within %s", payment.ErrUnavailable, s.opts.CommitWait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// nextRound returns the round that starts after every round already
// started, and wakes the loop.
func (s *db) nextRound() *round {
	c := &s.confirmed
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		r := &round{done: make(chan struct{}), err: errClosed}
		close(r.done)
		return r
	}
	if c.next == nil {
		c.next = &round{done: make(chan struct{})}
	}
	select {
	case c.asked <- struct{}{}:
	default:
	}
	return c.next
}

// confirmRounds runs the rounds until ctx ends, then closes the rounds'
// connection and fails the round callers wait for, and any later one. A
// round that failed leaves what it was to confirm for the next, after a
// backoff (retry.Default).
func (s *db) confirmRounds(ctx context.Context) {
	c := &s.confirmed
	defer close(c.done)
	defer s.stopRounds()
	failures := 0
	for {
		delay := confirmEvery
		if failures > 0 {
			delay += retry.Default.Wait(failures)
		}
		if !c.await(ctx, delay) {
			return
		}
		r, asked := c.take()
		r.err = s.confirmRound(ctx, asked)
		close(r.done)
		if r.err == nil {
			failures = 0
			continue
		}
		failures++
		s.transactionEnded() // what it was to confirm is still to confirm
	}
}

// await waits until a round is due: at once when a caller waits for one,
// delay after a transaction ended. It reports false once ctx has ended.
func (c *confirmer) await(ctx context.Context, delay time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c.asked:
		return true
	case <-c.ended:
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-c.asked:
	case <-t.C:
	}
	return true
}

// take returns the round to run now: the one callers wait for, if any
// (asked), or one of the loop's own. It confirms every transaction that
// ended before take, so their signals are spent.
func (c *confirmer) take() (r *round, asked bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.asked:
	default:
	}
	select {
	case <-c.ended:
	default:
	}
	if c.next == nil {
		return &round{done: make(chan struct{})}, false
	}
	r, c.next = c.next, nil
	return r, true
}

// confirmRound is one round: it confirms everything that ended before it and
// remembers its snapshot. One no caller asked for first looks whether the
// last round's snapshot still covers what a read would see, and if so
// commits nothing (a transaction that ended may have written nothing).
func (s *db) confirmRound(ctx context.Context, asked bool) error {
	conn, err := s.roundConn(ctx)
	if err != nil {
		return err
	}
	if !asked {
		var text string
		if err := conn.QueryRow(ctx, snapshotSQL).Scan(&text); err != nil {
			return asUnavailable(fmt.Errorf("take a snapshot before a round: %w", err))
		}
		now, err := parseSnapshot(text)
		if err != nil {
			return fmt.Errorf("%w: %w", payment.ErrUnavailable, err)
		}
		if s.confirmed.known.Load().covers(now) {
			return nil
		}
	}
	s.confirmed.rounds.Add(1)
	snap, err := confirm(ctx, conn, s.confirmed.txSQL)
	if err != nil {
		return err
	}
	s.confirmed.known.Store(snap)
	return nil
}

// roundConn returns the rounds' connection, connecting it (within
// AcquireWait) when there is none, or when it was lost or its server is now
// a standby (see Connect).
func (s *db) roundConn(ctx context.Context) (*pgx.Conn, error) {
	c := &s.confirmed
	if c.conn != nil && (c.conn.IsClosed() || c.conn.PgConn().ParameterStatus("in_hot_standby") == "on") {
		_ = c.conn.Close(ctx)
		c.conn = nil
	}
	if c.conn != nil {
		return c.conn, nil
	}
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.DialFunc = (&net.Dialer{KeepAliveConfig: roundKeepAlive}).DialContext
	connectCtx, cancel := context.WithTimeout(ctx, s.opts.AcquireWait)
	defer cancel()
	conn, err := pgx.ConnectConfig(connectCtx, cfg)
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("connect for confirmation rounds: %w", err))
	}
	c.conn = conn
	return conn, nil
}

// stopRounds closes the rounds' connection and fails the round callers wait
// for, and every later one.
func (s *db) stopRounds() {
	c := &s.confirmed
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.conn.Close(ctx)
		cancel()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.next != nil {
		c.next.err = errClosed
		close(c.next.done)
		c.next = nil
	}
}
