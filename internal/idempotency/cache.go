package idempotency

import (
	"bytes"
	"container/list"
	"sync"
	"time"
)

// Cache holds recently completed responses so hot replays skip the database.
// Stored responses never change, so a cached one is exactly what the database
// would replay. Entries are bounded in number and in bytes, scoped by merchant,
// and dropped before their key expires in the database.
type Cache struct {
	max      int
	maxBytes int64
	bytes    int64 // guarded by mu, like the fields below
	ttl      time.Duration
	now      func() time.Time
	mu       sync.Mutex
	lru      *list.List // front: most recently used *entry
	byKey    map[scope]*list.Element
	hits     int64
	misses   int64
}

type entry struct {
	scope       scope
	fingerprint Fingerprint
	resp        Response
	expires     time.Time
}

// EntryOverhead is what an entry costs besides its key, body and location:
// the entry, its list element and map slot, the fingerprint, the strings'
// and slices' headers, rounded up.
const EntryOverhead = 320

// MaxEntryShare bounds an entry: a response over 1/MaxEntryShare of the byte budget
// skips the cache, so one large response cannot evict hundreds of small ones.
const MaxEntryShare = 256

func (e *entry) size() int64 {
	return int64(len(e.scope.key)+len(e.resp.Location)+len(e.resp.Body)) + EntryOverhead
}

// ClockMargin is taken off a cached entry's life, so clock skew between this
// process and the database cannot make it outlive the key it mirrors.
const ClockMargin = time.Minute

// NewCache returns a cache of at most max responses taking at most maxBytes
// (see EntryOverhead, MaxEntryShare), of keys kept for ttl. A max or maxBytes
// of zero or less disables it.
func NewCache(max int, maxBytes int64, ttl time.Duration) *Cache {
	if maxBytes <= 0 {
		max = 0
	}
	return &Cache{max: max, maxBytes: maxBytes, ttl: ttl, now: time.Now, lru: list.New(), byKey: make(map[scope]*list.Element)}
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
	e := &entry{scope: scopeOf(req), fingerprint: req.Fingerprint, resp: resp, expires: expires}
	if e.size() > c.maxBytes/MaxEntryShare {
		return
	}
	// A copy, so the entry holds exactly the bytes it is counted for.
	e.resp.Body = bytes.Clone(resp.Body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[e.scope]; ok {
		c.lru.MoveToFront(el)
		return // a stored response never changes
	}
	c.byKey[e.scope] = c.lru.PushFront(e)
	c.bytes += e.size()
	for c.lru.Len() > c.max || c.bytes > c.maxBytes {
		c.remove(c.lru.Back())
	}
}

func (c *Cache) remove(el *list.Element) {
	e := el.Value.(*entry)
	c.lru.Remove(el)
	delete(c.byKey, e.scope)
	c.bytes -= e.size()
}

// Len reports how many responses are cached.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Bytes reports how many bytes the cached responses are counted for.
func (c *Cache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Stats reports cache hits and misses so far.
func (c *Cache) Stats() (hits, misses int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
