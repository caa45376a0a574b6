package idempotency

import (
	"container/list"
	"sync"
	"time"
)

// Cache holds recently completed responses so hot replays skip the database.
// Stored responses never change, so a cached one is exactly what the database
// would replay. Entries are bounded in number, scoped by merchant, and dropped
// before their key expires in the database.
type Cache struct {
	max    int
	ttl    time.Duration
	now    func() time.Time
	mu     sync.Mutex
	lru    *list.List // front: most recently used *entry
	byKey  map[scope]*list.Element
	hits   int64
	misses int64
}

type entry struct {
	scope       scope
	fingerprint Fingerprint
	resp        Response
	expires     time.Time
}

// ClockMargin is taken off a cached entry's life, so clock skew between this
// process and the database cannot make it outlive the key it mirrors.
const ClockMargin = time.Minute

// NewCache returns a cache of at most max responses of keys kept for ttl.
// A max of zero or less disables it.
func NewCache(max int, ttl time.Duration) *Cache {
	return &Cache{max: max, ttl: ttl, now: time.Now, lru: list.New(), byKey: make(map[scope]*list.Element)}
}

// Lookup answers req from the cache if it holds its key: a replay, or
// ErrKeyReused for a different request. It reports false on a miss.
func (c *Cache) Lookup(req Request) (Result, error, bool) {
	if c.max <= 0 {
		return Result{}, nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[scopeOf(req)]
	if !ok {
		c.misses++
		return Result{}, nil, false
	}
	e := el.Value.(*entry)
	if !c.now().Before(e.expires) {
		c.remove(el)
		c.misses++
		return Result{}, nil, false
	}
	c.hits++
	c.lru.MoveToFront(el)
	res, err := Replay(req, e.fingerprint, e.resp)
	return res, err, true
}

// Add remembers the response stored for req's key at storedAt (by the
// database's clock).
func (c *Cache) Add(req Request, resp Response, storedAt time.Time) {
	expires := storedAt.Add(c.ttl - ClockMargin)
	if c.max <= 0 || !c.now().Before(expires) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := scopeOf(req)
	if el, ok := c.byKey[s]; ok {
		c.lru.MoveToFront(el)
		return // a stored response never changes
	}
	c.byKey[s] = c.lru.PushFront(&entry{scope: s, fingerprint: req.Fingerprint, resp: resp, expires: expires})
	for c.lru.Len() > c.max {
		c.remove(c.lru.Back())
	}
}

func (c *Cache) remove(el *list.Element) {
	c.lru.Remove(el)
	delete(c.byKey, el.Value.(*entry).scope)
}

// Len reports how many responses are cached.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Stats reports cache hits and misses so far.
func (c *Cache) Stats() (hits, misses int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
