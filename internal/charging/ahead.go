package charging

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/payment"
)

// Batches decided ahead. A batch costs two round trips when it locks and
// reads its keys and accounts before deciding (chargeTx). But the accounts
// a process charges are mostly ones it charged a moment ago, and it knows how
// it left them: the book keeps each account as this process's last batch on
// it found it under its lock and left it. When every member's account is in
// the book with no holds, the batch is decided at once against the book, by
// the same decideBatch (every key free and stored nowhere, every account as
// recorded, the database's clock as this process reads it for the batch's:
// dbClock), and sent with the check of
// those premises in one round trip that ends with its commit
// (chargedb.Store.CommitAhead). The database takes the same locks (it
// waits a millisecond at most for one held elsewhere, then refuses) and
// commits only if every premise holds, so the decisions are
// those a locked batch would have made; otherwise it writes nothing, the
// book forgets the batch's accounts, and the batch runs again the usual way
// (a refund, a capture, another replica or a retry changed something; a key
// in flight or an account locked elsewhere). What the book holds is never
// trusted, only checked: it is a guess that saves a round trip when right.
// A refusal costs one, so after refusals the book sits out a few batches,
// twice as many after each refusal in a row (maxBackoff).

// bookSize bounds the book (an entry is about 100 bytes with the map's
// share): past it, the book starts again empty.
const bookSize = 1 << 16

// maxBackoff bounds how many batches in a row run the usual way after
// refusals: where another writer keeps changing the accounts (replicas
// charging the same ones, refunds, deposits), the book is mostly wrong, and
// one batch in maxBackoff+1 then pays for a refusal.
const maxBackoff = 64

// book is this process's record of accounts as its batches left them.
type book struct {
	mu       sync.Mutex
	accounts map[chargedb.AccountKey]bookEntry
	// committed and refused count the batches decided ahead that committed
	// and that the database refused.
	committed, refused atomic.Uint64
	// skip is how many of the next batches it could decide ahead run the
	// usual way instead: each refusal sets it to backoff, doubled (at most
	// maxBackoff), and a commit ahead sets backoff back to 0.
	skip, backoff int
}

type bookEntry struct {
	currency      string
	balance, held int64
}

// take returns copies of the accounts of reqs, to decide against, and
// their states before the batch, to be checked, when the book holds every
// one with no holds and no refusal asks to skip this batch.
func (b *book) take(reqs []chargedb.KeyedCharge) (map[chargedb.AccountKey]*payment.Account, []payment.Account, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	accounts := make(map[chargedb.AccountKey]*payment.Account, len(reqs))
	var before []payment.Account
	for _, r := range reqs {
		ak := r.Account()
		if accounts[ak] != nil {
			continue
		}
		e, ok := b.accounts[ak]
		if !ok || e.held != 0 {
			return nil, nil, false
		}
		a := payment.Account{MerchantID: ak.Merchant, ID: ak.ID, Currency: e.currency, Balance: e.balance}
		accounts[ak], before = &a, append(before, a)
	}
	if b.skip > 0 { // a batch it could decide ahead, sat out after refusals
		b.skip--
		return nil, nil, false
	}
	return accounts, before, true
}

// put records accounts as a batch that committed left them.
func (b *book) put(accounts map[chargedb.AccountKey]*payment.Account) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.accounts == nil || len(b.accounts)+len(accounts) > bookSize {
		b.accounts = make(map[chargedb.AccountKey]bookEntry)
	}
	for ak, a := range accounts {
		b.accounts[ak] = bookEntry{currency: a.Currency, balance: a.Balance, held: a.Held}
	}
}

// forget drops the accounts of reqs: a batch on them failed or was refused,
// so how they stand is not known here.
func (b *book) forget(reqs []chargedb.KeyedCharge) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range reqs {
		delete(b.accounts, r.Account())
	}
}

// ended records how a batch decided ahead ended: committed, or refused.
func (b *book) ended(committed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if committed {
		b.committed.Add(1)
		b.backoff = 0
		return
	}
	b.refused.Add(1)
	b.backoff = min(max(1, 2*b.backoff), maxBackoff)
	b.skip = b.backoff
}

// chargeAhead runs reqs as a batch decided ahead when the book holds all
// their accounts; ok is false when it did not run (the book lacks one) or
// the database refused it, and then nothing was written.
func (s *Path) chargeAhead(ctx context.Context, reqs []chargedb.KeyedCharge) (answers []chargeAnswer, ok bool, err error) {
	accounts, before, ok := s.book.take(reqs)
	if !ok {
		return nil, false, nil
	}
	n := len(reqs)
	locks := &chargedb.Locks{
		KeyHeld: make([]bool, n), Stored: make([]chargedb.StoredKey, n),
		Now:      s.clock.now(),
		Accounts: accounts, Busy: map[chargedb.AccountKey]bool{},
	}
	for i := range locks.KeyHeld {
		locks.KeyHeld[i] = true
	}
	answers, decided, w := decideBatch(reqs, locks, s.opts.AuthorizationTTL)
	sent := s.clock.local()
	storedAt, err := s.db.CommitAhead(ctx, reqs, chargedb.Expected{At: locks.Now, Accounts: before}, &w.Writes)
	if err != nil {
		s.book.forget(reqs)
		if errors.Is(err, chargedb.ErrNotAsExpected) {
			s.book.ended(false)
			return nil, false, nil
		}
		return nil, false, err
	}
	s.clock.saw(storedAt, sent)
	s.book.ended(true)
	s.book.put(accounts)
	for i := range answers {
		if decided[i] && answers[i].err == nil {
			answers[i].res.StoredAt = storedAt
		}
	}
	return answers, true, nil
}

// dbClock reads the database's clock in this process: a batch decided ahead
// carries it into its rows, and the database takes it only when it is not
// after its own (nor more than a second before its transaction began). The
// hosts' clocks may differ by more than a round trip, so it is this
// process's clock corrected by the last reading of the database's (a
// batch's transaction clock, or the moment its responses were stored): that
// reading, taken at some moment between sending and receiving, is set
// against the moment the answer arrived, so the corrected clock trails the
// database's by up to a round trip, never leads it (while neither clock
// jumps).
type dbClock struct {
	offset   atomic.Int64     // nanoseconds the database's clock is ahead of this process's
	localNow func() time.Time // time.Now; a test's skewed clock
}

// now is the database's clock as this process reads it, in microseconds
// as PostgreSQL keeps them (Truncate also drops the monotonic reading).
func (c *dbClock) now() time.Time {
	return c.local().Add(time.Duration(c.offset.Load())).Truncate(time.Microsecond)
}

// saw records a reading of the database's clock taken in a round trip sent
// at sent (this process's clock) that has just ended. A round trip longer
// than clockReadingWithin (a wait for locks, for the standby) is passed
// over: the corrected clock would trail by all of it.
func (c *dbClock) saw(db, sent time.Time) {
	received := c.local()
	if !db.IsZero() && received.Sub(sent) <= clockReadingWithin {
		c.offset.Store(int64(db.Sub(received)))
	}
}

// clockReadingWithin is the longest round trip whose reading of the
// database's clock is kept.
const clockReadingWithin = 100 * time.Millisecond

func (c *dbClock) local() time.Time {
	if c.localNow != nil {
		return c.localNow()
	}
	return time.Now()
}

// AheadStats counts the charge batches decided ahead: committed in one round
// trip, and refused by the database (run again as locked batches).
func (s *Path) AheadStats() (committed, refused uint64) {
	return s.book.committed.Load(), s.book.refused.Load()
}
