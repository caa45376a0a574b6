package idempotency

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Front is the in-process front of the key store: a request is answered from
// the cache of completed responses if it can be, else coalesced with
// concurrent requests for its key, else executed by the store.
type Front struct {
	cache     *Cache
	coalescer Coalescer
}

// NewFront returns a front with a cache of at most cacheSize responses and
// cacheBytes bytes of keys kept for ttl (0 disables the cache), whose
// coalesced requests wait at most wait for the one executing their key (0: as
// long as it runs).
func NewFront(cacheSize int, cacheBytes int64, ttl, wait time.Duration) *Front {
	return &Front{cache: NewCache(cacheSize, cacheBytes, ttl), coalescer: Coalescer{Wait: wait}}
}

// Do answers req, calling exec (the store) at most once for all the
// concurrent requests of its key in this process. See Coalescer.Do.
func (f *Front) Do(ctx context.Context, req Request, exec func(context.Context) (Result, error)) (Result, error) {
	if res, err, ok := f.cache.Lookup(req); ok {
		return res, err
	}
	return f.coalescer.Do(ctx, req, func(ctx context.Context) (Result, error) {
		res, err := exec(ctx)
		if err == nil && res.Operation == uuid.Nil { // an operation going on has no response yet
			f.cache.Add(req, res.Response, res.StoredAt)
		}
		return res, err
	})
}

// Cache returns the front's cache, for statistics.
func (f *Front) Cache() *Cache { return f.cache }

// InFlight reports how many keys are executing in this process.
func (f *Front) InFlight() int { return f.coalescer.InFlight() }
