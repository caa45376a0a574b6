package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

func request(merchant uuid.UUID, key string, fp byte) Request {
	return Request{MerchantID: merchant, Key: key, Fingerprint: Fingerprint{fp}}
}

// TestCoalescerSharesOneExecution releases many identical requests at once:
// one executes, the others replay its response, and no state is left behind.
func TestCoalescerSharesOneExecution(t *testing.T) {
	var c Coalescer
	merchant := uuid.New()
	var executions atomic.Int32
	release := make(chan struct{})
	exec := func(context.Context) (Result, error) {
		executions.Add(1)
		<-release // hold the leader until every follower has queued
		return Result{Response: Response{Status: 201, Body: []byte("charged")}}, nil
	}

	const n = 50
	results := make([]Result, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = c.Do(context.Background(), request(merchant, "k", 1), exec)
		})
	}
	close(start)
	waitForFollowers(&c, n-1)
	close(release)
	wg.Wait()

	if executions.Load() != 1 {
		t.Errorf("%d executions, want 1", executions.Load())
	}
	replayed := 0
	for i := range n {
		if errs[i] != nil || string(results[i].Body) != "charged" {
			t.Fatalf("request %d: %+v, %v", i, results[i], errs[i])
		}
		if results[i].Replayed {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replays, want %d", replayed, n-1)
	}
	if c.InFlight() != 0 || len(c.calls) != 0 {
		t.Errorf("%d keys still tracked after every request finished", len(c.calls))
	}
}

func TestCoalescerFollowers(t *testing.T) {
	merchant := uuid.New()
	cases := []struct {
		name        string
		leaderErr   error
		followerFP  byte
		wantErr     error
		wantExecute bool // the follower runs exec itself
	}{
		{"other request under the key", nil, 2, ErrKeyReused, false},
		{"leader refused as reused", ErrKeyReused, 1, ErrKeyReused, false},
		{"leader timed out behind another", ErrKeyInUse, 1, ErrKeyInUse, false},
		{"leader failed: follower executes", errors.New("database gone"), 1, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c Coalescer
			release := make(chan struct{})
			leaderDone := make(chan struct{})
			go func() {
				defer close(leaderDone)
				_, _ = c.Do(context.Background(), request(merchant, "k", 1), func(context.Context) (Result, error) {
					<-release
					return Result{Response: Response{Status: 201}}, tc.leaderErr
				})
			}()
			for c.InFlight() == 0 {
				time.Sleep(time.Millisecond)
			}
			followerDone := make(chan struct{})
			executed := false
			var err error
			go func() {
				defer close(followerDone)
				_, err = c.Do(context.Background(), request(merchant, "k", tc.followerFP), func(context.Context) (Result, error) {
					executed = true
					return Result{Response: Response{Status: 201}}, nil
				})
			}()
			waitForFollowers(&c, 1)
			close(release)
			<-leaderDone
			<-followerDone
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("follower error %v, want %v", err, tc.wantErr)
			}
			if executed != tc.wantExecute {
				t.Errorf("follower executed = %v, want %v", executed, tc.wantExecute)
			}
		})
	}
}

// A follower waits for its leader at most Wait, as a retry on another replica
// waits for the database, then gets ErrKeyInUse without executing; the
// leader goes on.
func TestCoalescerFollowerWaitIsBounded(t *testing.T) {
	const wait = 200 * time.Millisecond
	c := Coalescer{Wait: wait}
	merchant := uuid.New()
	release := make(chan struct{})
	leaderDone := make(chan error)
	go func() {
		_, err := c.Do(context.Background(), request(merchant, "k", 1), func(context.Context) (Result, error) {
			<-release
			return Result{Response: Response{Status: 201}}, nil
		})
		leaderDone <- err
	}()
	for c.InFlight() == 0 {
		time.Sleep(time.Millisecond)
	}
	began := time.Now()
	_, err := c.Do(context.Background(), request(merchant, "k", 1), func(context.Context) (Result, error) {
		t.Error("the follower executed")
		return Result{}, nil
	})
	waited := time.Since(began)
	if !errors.Is(err, ErrKeyInUse) || waited < wait || waited > wait+500*time.Millisecond {
		t.Errorf("follower got %v after %v, want ErrKeyInUse after %v", err, waited, wait)
	}
	close(release)
	if err := <-leaderDone; err != nil {
		t.Errorf("leader: %v", err)
	}
}

// A leader that panics hands its followers ErrLeaderPanicked: they neither
// replay an empty success nor execute; the panic goes on up the leader's stack.
func TestCoalescerLeaderPanic(t *testing.T) {
	var c Coalescer
	merchant := uuid.New()
	release := make(chan struct{})
	leaderDone := make(chan any)
	go func() {
		defer func() { leaderDone <- recover() }()
		_, _ = c.Do(context.Background(), request(merchant, "k", 1), func(context.Context) (Result, error) {
			<-release
			panic("bug")
		})
	}()
	for c.InFlight() == 0 {
		time.Sleep(time.Millisecond)
	}
	followerDone := make(chan error)
	go func() {
		_, err := c.Do(context.Background(), request(merchant, "k", 1), func(context.Context) (Result, error) {
			t.Error("the follower executed")
			return Result{}, nil
		})
		followerDone <- err
	}()
	waitForFollowers(&c, 1)
	close(release)
	if r := <-leaderDone; r != "bug" {
		t.Errorf("the leader's panic was %v, want it to go on", r)
	}
	if err := <-followerDone; !errors.Is(err, ErrLeaderPanicked) {
		t.Errorf("follower got %v, want ErrLeaderPanicked", err)
	}
	if c.InFlight() != 0 {
		t.Error("the panicked key is still in flight")
	}
}

func TestCoalescerKeysAreIndependent(t *testing.T) {
	var c Coalescer
	a, b := uuid.New(), uuid.New()
	var executions atomic.Int32
	exec := func(context.Context) (Result, error) {
		executions.Add(1)
		return Result{}, nil
	}
	for _, req := range []Request{request(a, "k", 1), request(b, "k", 1), request(a, "other", 1)} {
		if _, err := c.Do(context.Background(), req, exec); err != nil {
			t.Fatal(err)
		}
	}
	if executions.Load() != 3 {
		t.Errorf("%d executions for three distinct (merchant, key) pairs", executions.Load())
	}
}

func TestCache(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	c := NewCache(2, 64<<20, 24*time.Hour)
	c.now = func() time.Time { return now }
	alice, bob := uuid.New(), uuid.New()
	resp := Response{Status: 201, Location: "/v1/charges/ch_1", Body: []byte(`{"id":"ch_1"}`)}
	c.Add(request(alice, "k1", 1), resp, now)

	if res, err, ok := c.Lookup(request(alice, "k1", 1)); !ok || err != nil || !res.Replayed || string(res.Body) != string(resp.Body) {
		t.Errorf("hit = %+v, %v, %v", res, err, ok)
	}
	if _, err, ok := c.Lookup(request(alice, "k1", 2)); !ok || !errors.Is(err, ErrKeyReused) {
		t.Errorf("different request under the key: %v, %v", err, ok)
	}
	if _, _, ok := c.Lookup(request(bob, "k1", 1)); ok {
		t.Error("another merchant's entry was served")
	}

	// Bounded: the least recently used entry goes.
	c.Add(request(alice, "k2", 1), resp, now)
	c.Lookup(request(alice, "k1", 1))
	c.Add(request(alice, "k3", 1), resp, now)
	if c.Len() != 2 {
		t.Errorf("%d entries, want at most 2", c.Len())
	}
	if _, _, ok := c.Lookup(request(alice, "k2", 1)); ok {
		t.Error("the least recently used entry was kept")
	}

	// Never past the key's expiry, with a margin for clock skew.
	now = now.Add(24*time.Hour - ClockMargin)
	if _, _, ok := c.Lookup(request(alice, "k1", 1)); ok {
		t.Error("an entry was served at its key's expiry")
	}
	c.Add(request(alice, "old", 1), resp, now.Add(-24*time.Hour))
	if c.Len() != 1 {
		t.Errorf("%d entries after adding an expired response to the one live entry, want 1", c.Len())
	}
	if _, _, ok := c.Lookup(request(alice, "old", 1)); ok {
		t.Error("an already expired response was cached")
	}

	// Hits (exported as payments_idempotency_cache_hits_total) and misses: the
	// two answers for k1 and the one after the eviction are hits, even the
	// refusal of a different request; bob, the evicted k2, k1 at its expiry
	// and the never cached response are misses.
	if hits, misses := c.Stats(); hits != 3 || misses != 4 {
		t.Errorf("Stats = %d hits, %d misses; want 3 and 4", hits, misses)
	}
}

// TestFrontReplaysFromTheCache: once a key's request has executed, the front
// answers its retries from the cache without executing again, and refuses a
// different request under the key; a failed execution is not remembered.
func TestFrontReplaysFromTheCache(t *testing.T) {
	g := NewFront(10, 64<<20, 24*time.Hour, 0)
	merchant := uuid.New()
	var executions atomic.Int32
	fail := errors.New("database gone")
	exec := func(err error) func(context.Context) (Result, error) {
		return func(context.Context) (Result, error) {
			executions.Add(1)
			if err != nil {
				return Result{}, err
			}
			return Result{Response: Response{Status: 201, Body: []byte("charged")}, StoredAt: time.Now()}, nil
		}
	}
	ctx := context.Background()

	if _, err := g.Do(ctx, request(merchant, "failing", 1), exec(fail)); !errors.Is(err, fail) {
		t.Fatalf("first execution: %v, want %v", err, fail)
	}
	if res, err := g.Do(ctx, request(merchant, "failing", 1), exec(nil)); err != nil || res.Replayed {
		t.Errorf("retry after a failure: %+v, %v; want a fresh execution", res, err)
	}
	if n := executions.Load(); n != 2 {
		t.Errorf("%d executions, want 2: a failure must not be cached", n)
	}

	first, err := g.Do(ctx, request(merchant, "k", 1), exec(nil))
	if err != nil || first.Replayed {
		t.Fatalf("first execution: %+v, %v", first, err)
	}
	again, err := g.Do(ctx, request(merchant, "k", 1), exec(nil))
	if err != nil || !again.Replayed || again.Status != 201 || string(again.Body) != "charged" {
		t.Errorf("retry = %+v, %v; want the replay of 201 charged", again, err)
	}
	if _, err := g.Do(ctx, request(merchant, "k", 2), exec(nil)); !errors.Is(err, ErrKeyReused) {
		t.Errorf("a different request under the key: %v, want ErrKeyReused", err)
	}
	if n := executions.Load(); n != 3 {
		t.Errorf("%d executions, want 3: the retry and the reuse are answered from the cache", n)
	}
	if hits, _ := g.Cache().Stats(); hits != 2 || g.Cache().Len() != 2 {
		t.Errorf("%d cache hits and %d entries, want 2 and 2", hits, g.Cache().Len())
	}
}

func TestDisabledCache(t *testing.T) {
	c := NewCache(0, 64<<20, time.Hour)
	c.Add(request(uuid.New(), "k", 1), Response{Status: 201}, time.Now())
	if c.Len() != 0 {
		t.Error("a disabled cache stored an entry")
	}
}

// waitForFollowers waits until n requests queue behind the running leader.
func waitForFollowers(c *Coalescer, n int) {
	for {
		c.mu.Lock()
		queued := 0
		for _, cl := range c.calls {
			queued = cl.followers
		}
		c.mu.Unlock()
		if queued >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCacheIsBoundedInBytes offers a cache of 1 MiB thirty times that in
// large responses: it keeps at most its budget, counted honestly (the heap
// it holds, measured), skips a response over its share, and a disabled
// budget caches nothing.
func TestCacheIsBoundedInBytes(t *testing.T) {
	const budget = 1 << 20
	now := time.Now()
	merchant := uuid.New()
	body := bytes.Repeat([]byte("<&>"), 1024) // 3 KiB, under the 4 KiB share of 1 MiB
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := NewCache(1_000_000, budget, 24*time.Hour)
	for i := range 10_000 {
		c.Add(request(merchant, fmt.Sprintf("key-%05d", i), 1), Response{Status: 201, Body: body}, now)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	perEntry := int64(len("key-00000")+len(body)) + EntryOverhead
	t.Logf("10,000 responses of %d bytes offered: %d kept, %d bytes counted, heap grew %d bytes", len(body), c.Len(), c.Bytes(), held)
	if c.Bytes() > budget || c.Bytes() != int64(c.Len())*perEntry || c.Len() != budget/int(perEntry) {
		t.Errorf("%d entries counted as %d bytes; want %d entries of %d bytes within %d", c.Len(), c.Bytes(), budget/perEntry, perEntry, budget)
	}
	if held > budget*5/4 {
		t.Errorf("the cache holds %d bytes of heap, more than its %d-byte budget allows", held, budget)
	}
	if _, _, ok := c.Lookup(request(merchant, "key-09999", 1)); !ok {
		t.Error("the newest entry was not kept")
	}
	if _, _, ok := c.Lookup(request(merchant, "key-00000", 1)); ok {
		t.Error("the oldest entry was kept past the budget")
	}

	large := Response{Status: 201, Body: bytes.Repeat([]byte("x"), budget/MaxEntryShare)}
	c.Add(request(merchant, "large", 1), large, now)
	if _, _, ok := c.Lookup(request(merchant, "large", 1)); ok {
		t.Error("a response over the entry share was cached")
	}
	runtime.KeepAlive(c)

	off := NewCache(10, 0, time.Hour)
	off.Add(request(merchant, "k", 1), Response{Status: 201}, now)
	if off.Len() != 0 {
		t.Error("a cache with no byte budget stored an entry")
	}
}

// TestCacheByteBoundsAreExact pins the byte bounds where they start: an entry
// of exactly 1/MaxEntryShare of the budget is cached, one byte more is not; a
// cache holding exactly its budget (and exactly its count) evicts nothing,
// and one entry more evicts the oldest.
func TestCacheByteBoundsAreExact(t *testing.T) {
	const share = 1024
	now := time.Now()
	merchant := uuid.New()
	// An entry's size is its key, location and body, plus EntryOverhead.
	bodyOf := func(key, location string, size int) []byte {
		return bytes.Repeat([]byte("x"), size-EntryOverhead-len(key)-len(location))
	}
	c := NewCache(MaxEntryShare, share*MaxEntryShare, 24*time.Hour)
	c.Add(request(merchant, "big", 1), Response{Status: 201, Location: "/l", Body: bodyOf("big", "/l", share+1)}, now)
	if c.Len() != 0 {
		t.Fatalf("an entry of %d bytes, over the share of %d, was cached", share+1, share)
	}
	for i := range MaxEntryShare {
		key := fmt.Sprintf("k%03d", i)
		c.Add(request(merchant, key, 1), Response{Status: 201, Location: "/l", Body: bodyOf(key, "/l", share)}, now)
		if want := int64((i + 1) * share); c.Bytes() != want {
			t.Fatalf("after %d entries of %d bytes the cache counts %d bytes, want %d", i+1, share, c.Bytes(), want)
		}
	}
	if c.Len() != MaxEntryShare {
		t.Fatalf("a cache filled to exactly its budget and count holds %d entries, want %d", c.Len(), MaxEntryShare)
	}
	c.Add(request(merchant, "k999", 1), Response{Status: 201, Location: "/l", Body: bodyOf("k999", "/l", share)}, now)
	if c.Len() != MaxEntryShare || c.Bytes() != share*MaxEntryShare {
		t.Fatalf("one more entry: %d entries, %d bytes; want %d and %d", c.Len(), c.Bytes(), MaxEntryShare, share*MaxEntryShare)
	}
	if _, _, ok := c.Lookup(request(merchant, "k000", 1)); ok {
		t.Error("the oldest entry was not the one evicted")
	}
}
