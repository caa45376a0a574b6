package postgres

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"
)

// keyUses records when API keys were last used (api_keys.last_used_at, at
// most once a minute a key), off the request path: a request whose key's
// last use is due only notes it here, and recordKeyUses writes the notes in
// a transaction of its own. A request never waits for that write, so a
// standby that stops confirming commits, or a lock on the key's row, delays
// no request; the last use is written a moment after the request
// instead, or lost with the process.
type keyUses struct {
	mu   sync.Mutex
	due  map[[sha256.Size]byte]struct{}
	wake chan struct{}
}

// keyUsesMax bounds the notes kept while their write fails: past it, a
// key's use is dropped (its next request notes it again).
const keyUsesMax = 10_000

// note records that the key hashed to hash was used, and wakes the writer.
func (u *keyUses) note(hash [sha256.Size]byte) {
	u.mu.Lock()
	if u.due == nil {
		u.due = make(map[[sha256.Size]byte]struct{})
	}
	if len(u.due) < keyUsesMax {
		u.due[hash] = struct{}{}
	}
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// take returns the noted hashes and forgets them.
func (u *keyUses) take() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	hashes := make([][]byte, 0, len(u.due))
	for h := range u.due {
		hashes = append(hashes, h[:])
	}
	clear(u.due)
	return hashes
}

// giveBack notes hashes again after their write failed.
func (u *keyUses) giveBack(hashes [][]byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, h := range hashes {
		if len(u.due) < keyUsesMax {
			u.due[[sha256.Size]byte(h)] = struct{}{}
		}
	}
}

// recordKeyUsesSQL writes the last use of the noted keys, still valid and
// not written within the minute.
const recordKeyUsesSQL = `
UPDATE api_keys SET last_used_at = now()
WHERE hash = ANY ($1::bytea[]) AND revoked_at IS NULL
  AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`

// recordKeyUses writes the noted key uses whenever there are some, until
// ctx ends, and then once more (for at most a second). A failed write keeps
// its notes for the next, a second later at the soonest.
func (s *db) recordKeyUses(ctx context.Context) {
	defer close(s.keyUsesDone)
	write := func(ctx context.Context) bool {
		hashes := s.keyUses.take()
		if len(hashes) == 0 {
			return true
		}
		_, err := s.pool.Exec(ctx, recordKeyUsesSQL, hashes)
		s.transactionEnded()
		if err != nil {
			s.keyUses.giveBack(hashes)
			return false
		}
		return true
	}
	for {
		select {
		case <-ctx.Done():
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			write(last)
			cancel()
			return
		case <-s.keyUses.wake:
		}
		if !write(ctx) {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}
