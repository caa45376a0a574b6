package postgres

import (
	"container/list"
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
)

// KeyBudget limits, per client address, the database lookups of API keys
// this process has not seen: a client may make Burst lookups that find
// nothing, then Rate a second. Lookups that find a valid key spend nothing,
// and a key looked up once is remembered (valid for authTrust, unknown for
// unknownForget), so only never-seen keys ever wait for the budget: at most
// Wait, and past that they are refused with a *payment.RetryAfter (429),
// never as unauthenticated, since they were not checked.
type KeyBudget struct {
	Burst int
	Rate  float64 // a second
	Wait  time.Duration
}

// DefaultKeyBudget is the budget of Options{}. A lookup that finds nothing
// is one index probe, a tenth of a millisecond of the database's time: 100 a
// second from one address costs it about 1% of a core, and a client that
// mistypes or scans at the tens a second seen in practice never makes a
// valid key wait. The UnknownKeyLookups slots bound the database's share
// however many addresses there are.
var DefaultKeyBudget = KeyBudget{Burst: 100, Rate: 100, Wait: time.Second}

// UnknownKeyLookups bounds the lookups of keys not known valid that run at
// once, in the whole process; it also bounds how far concurrent failures
// overshoot a client's budget.
const UnknownKeyLookups = 4

// unknownForget is how long a hash found unknown (or revoked) is answered
// from memory, and unknownCacheMax how many such hashes are kept (the least
// recently used go first). A key is 32 random bytes, shown only once its row
// has committed, so a hash found unknown cannot become valid later (that
// needs a guess of a 256-bit secret), and a revoked key never becomes valid
// again: the minute bounds only the memory, and how long an operator's hand
// edit of api_keys (a restored backup, a revocation undone in SQL) takes to
// be seen.
const (
	unknownForget    = time.Minute
	unknownCacheMax  = 10_000
	budgetMaxClients = 10_000
)

func (b KeyBudget) withDefaults() KeyBudget {
	if b.Burst <= 0 {
		b.Burst = DefaultKeyBudget.Burst
	}
	if b.Rate <= 0 {
		b.Rate = DefaultKeyBudget.Rate
	}
	if b.Wait <= 0 {
		b.Wait = DefaultKeyBudget.Wait
	}
	return b
}

// awaitLookup waits until client's budget has a token and one of the
// UnknownKeyLookups slots is free, and returns the slot's release. When the
// token would come later than the budget's Wait from now, it returns a
// *payment.RetryAfter at once; ctx bounds the wait for a slot.
func (s *Merchants) awaitLookup(ctx context.Context, client string) (release func(), err error) {
	deadline := time.Now().Add(s.budget.limits.Wait)
	for {
		now := time.Now()
		if d := s.budget.untilToken(client, now); d > 0 {
			if now.Add(d).After(deadline) {
				return nil, &payment.RetryAfter{Err: fmt.Errorf(
					"%w from your address: your key was not checked; keys this service has not seen yet wait up to %s for a lookup",
					payment.ErrTooManyUnknownKeys, s.budget.limits.Wait), After: d}
			}
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, s.lookupBusy(ctx)
			}
			continue
		}
		select {
		case s.unknownSlots <- struct{}{}:
		case <-ctx.Done():
			return nil, s.lookupBusy(ctx)
		}
		// Checked again with the slot: lookups that failed meanwhile may
		// have spent the token.
		if s.budget.untilToken(client, time.Now()) == 0 {
			return func() { <-s.unknownSlots }, nil
		}
		<-s.unknownSlots
	}
}

// lookupBusy is the answer of a key whose wait for a lookup ran out (ctx,
// bounded by LookupWait): the lookup slots were all taken by keys not known
// valid, and the database was never asked. It is 429 too-many-unknown-keys,
// to retry after a second, not the database unavailable.
func (s *Merchants) lookupBusy(ctx context.Context) error {
	return &payment.RetryAfter{Err: fmt.Errorf(
		"%w: your key was not checked: lookups of keys this service has not seen yet are busy (%w)",
		payment.ErrTooManyUnknownKeys, ctx.Err()), After: time.Second}
}

// unknownHashes remembers the hashes of keys found unknown or revoked, for
// unknownForget, the least recently used first to go past unknownCacheMax.
type unknownHashes struct {
	mu     sync.Mutex
	lru    *list.List // of unknownEntry, most recent in front
	byHash map[[sha256.Size]byte]*list.Element
}

type unknownEntry struct {
	hash  [sha256.Size]byte
	until time.Time
}

// has reports whether hash was found unknown less than unknownForget ago.
func (c *unknownHashes) has(hash [sha256.Size]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byHash[hash]
	if !ok {
		return false
	}
	if !now.Before(e.Value.(unknownEntry).until) {
		c.lru.Remove(e)
		delete(c.byHash, hash)
		return false
	}
	c.lru.MoveToFront(e)
	return true
}

// add remembers hash as unknown from now.
func (c *unknownHashes) add(hash [sha256.Size]byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byHash == nil {
		c.lru, c.byHash = list.New(), make(map[[sha256.Size]byte]*list.Element)
	}
	entry := unknownEntry{hash: hash, until: now.Add(unknownForget)}
	if e, ok := c.byHash[hash]; ok {
		e.Value = entry
		c.lru.MoveToFront(e)
		return
	}
	if c.lru.Len() >= unknownCacheMax {
		oldest := c.lru.Back()
		c.lru.Remove(oldest)
		delete(c.byHash, oldest.Value.(unknownEntry).hash)
	}
	c.byHash[hash] = c.lru.PushFront(entry)
}

// failureBudget is a token bucket per client address, spent by lookups that
// found nothing.
type failureBudget struct {
	limits  KeyBudget
	mu      sync.Mutex
	buckets map[string]bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// untilToken returns how long until client has a token: 0 if it has one.
func (b *failureBudget) untilToken(client string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.buckets[client]
	if !ok {
		return 0
	}
	missing := 1 - b.refilled(k, now)
	if missing <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(missing / b.limits.Rate * float64(time.Second)))
}

// charge takes a token from client's bucket for a lookup that found nothing.
// The bucket may go below zero: lookups that passed the check together
// (UnknownKeyLookups at most) are all paid for, and the next token comes as
// late as the rate says.
func (b *failureBudget) charge(client string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.buckets[client]
	if !ok {
		b.makeRoom(now)
		k = bucket{tokens: float64(b.limits.Burst), at: now}
	}
	b.buckets[client] = bucket{tokens: b.refilled(k, now) - 1, at: now}
}

func (b *failureBudget) refilled(k bucket, now time.Time) float64 {
	return min(float64(b.limits.Burst), k.tokens+now.Sub(k.at).Seconds()*b.limits.Rate)
}

// makeRoom keeps the map within budgetMaxClients: full buckets say nothing
// and go first; if that is not enough, it starts over.
func (b *failureBudget) makeRoom(now time.Time) {
	if b.buckets == nil {
		b.buckets = make(map[string]bucket)
	}
	if len(b.buckets) < budgetMaxClients {
		return
	}
	for c, k := range b.buckets {
		if b.refilled(k, now) >= float64(b.limits.Burst) {
			delete(b.buckets, c)
		}
	}
	if len(b.buckets) >= budgetMaxClients {
		b.buckets = make(map[string]bucket)
	}
}
