package idempotency

import (
	"context"
	"time"
)

// Guard is the in-process front of the key store: a request is answered from
// the cache of completed responses if it can be, else coalesced with
// concurrent requests for its key, else executed by the store.
type Guard struct {
	cache     *Cache
	coalescer Coalescer
}

// NewGuard returns a guard with a cache of at most cacheSize responses and
// cacheBytes bytes of keys kept for ttl (0 disables the cache), whose
// coalesced requests wait at most wait for the one executing their key (0: as
// long as it runs).
func NewGuard(cacheSize int, cacheBytes int64, ttl, wait time.Duration) *Guard {
	return &Guard{cache: NewCache(cacheSize, cacheBytes, ttl), coalescer: Coalescer{Wait: wait}}
}

// Do answers req, calling exec (the store) at most once for all the
// concurrent requests of its key in this process. See Coalescer.Do.
func (g *Guard) Do(ctx context.Context, req Request, exec func(context.Context) (Result, error)) (Result, error) {
	if res, err, ok := g.cache.Lookup(req); ok {
		return res, err
	}
	return g.coalescer.Do(ctx, req, func(ctx context.Context) (Result, error) {
		res, err := exec(ctx)
		if err == nil {
			g.cache.Add(req, res.Response, res.StoredAt)
		}
		return res, err
	})
}

// Cache returns the guard's cache, for statistics.
func (g *Guard) Cache() *Cache { return g.cache }

// InFlight reports how many keys are executing in this process.
func (g *Guard) InFlight() int { return g.coalescer.InFlight() }
