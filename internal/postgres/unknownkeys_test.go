package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/pgtest"
)

// openBudgeted opens a Store on the package database with budget, closed
// when the test ends.
func openBudgeted(t *testing.T, budget KeyBudget) *Store {
	t.Helper()
	s, err := Open(context.Background(), pgtest.DatabaseURL(t), Options{KeyBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// lookups counts the connections s has taken: one per key lookup.
func lookups(s *Store) int64 { return s.Pool().Stat().AcquireCount() }

// TestFailureBudget: a client may fail Burst lookups at once, then Rate a
// second; clients do not share a budget.
func TestFailureBudget(t *testing.T) {
	b := failureBudget{limits: KeyBudget{Burst: 3, Rate: 2, Wait: time.Second}}
	now := time.Now()
	for i := range b.limits.Burst {
		if d := b.untilToken("a", now); d != 0 {
			t.Fatalf("a token in %s after %d failures, within the burst", d, i)
		}
		b.charge("a", now)
	}
	if d := b.untilToken("a", now); d != 500*time.Millisecond {
		t.Fatalf("past the burst: a token in %s, want 500ms (rate 2/s)", d)
	}
	if d := b.untilToken("b", now); d != 0 {
		t.Errorf("another client shares a's budget: a token in %s", d)
	}
	later := now.Add(500 * time.Millisecond)
	if d := b.untilToken("a", later); d != 0 {
		t.Errorf("no token after one refill period: %s to go", d)
	}
	b.charge("a", later)
	if d := b.untilToken("a", later); d == 0 {
		t.Error("two tokens after one refill period")
	}
}

// TestValidKeysSpendNoBudget: many keys this process has never seen, valid
// and sent at once from one address (a restart behind a proxy), are all
// accepted; the address's budget is still whole.
func TestValidKeysSpendNoBudget(t *testing.T) {
	ctx := context.Background()
	s := openBudgeted(t, KeyBudget{Burst: 2, Rate: 0.1})
	const n = 50
	keys := make([]string, n)
	for i := range keys {
		_, key, err := s.RegisterMerchant(ctx, "burst-"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = key.Secret
	}
	errs := make(chan error, 2*n)
	start := make(chan struct{})
	for range 2 {
		for _, k := range keys {
			go func() { <-start; _, err := s.Authenticate(ctx, k, "proxy"); errs <- err }()
		}
	}
	close(start)
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Errorf("a valid key: %v", err)
		}
	}
	s.budget.mu.Lock()
	defer s.budget.mu.Unlock()
	if k, ok := s.budget.buckets["proxy"]; ok {
		t.Errorf("the proxy's budget after valid keys only: %+v, want untouched", k)
	}
}

// TestUnknownKeysAreRemembered: a made-up key, and a key in use when it is
// revoked, are looked up once; sent again, 200 times, 50 of them at once,
// they are refused from memory: no lookup, no budget spent. The made-up key
// spent one token; the revoked one, known valid until then, none.
func TestUnknownKeysAreRemembered(t *testing.T) {
	ctx := context.Background()
	s := openBudgeted(t, KeyBudget{})
	merchant, revoked, err := s.RegisterMerchant(ctx, "remembered")
	if err != nil {
		t.Fatal(err)
	}
	madeUp, err := newTestKey()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Authenticate(ctx, revoked.Secret, "client"); err != nil || got != merchant {
		t.Fatalf("before the revocation: %v, %v", got, err)
	}
	// That use is written off the request path (keyuse.go), on a pooled
	// connection of its own: wait for it, so that it is not counted as a
	// lookup below.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var written bool
		hash := sha256.Sum256([]byte(revoked.Secret))
		if err := s.Pool().QueryRow(ctx, `SELECT last_used_at IS NOT NULL FROM api_keys WHERE hash = $1`, hash[:]).Scan(&written); err != nil {
			t.Fatal(err)
		}
		if written {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key's use was not written within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.RevokeAPIKey(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	s.auth.mu.Lock()
	for h, e := range s.auth.entries { // past its trust, as 1 s later
		e.trustedUntil = time.Now().Add(-time.Millisecond)
		s.auth.entries[h] = e
	}
	s.auth.mu.Unlock()
	for _, key := range []string{madeUp, revoked.Secret} {
		before := lookups(s)
		if _, err := s.Authenticate(ctx, key, "client"); !errors.Is(err, payment.ErrUnauthenticated) {
			t.Fatalf("first use: %v, want ErrUnauthenticated", err)
		}
		if n := lookups(s) - before; n != 1 {
			t.Errorf("first use: %d lookups, want 1", n)
		}
		before = lookups(s)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 50 {
			wg.Go(func() {
				<-start
				if _, err := s.Authenticate(ctx, key, "client"); !errors.Is(err, payment.ErrUnauthenticated) {
					t.Errorf("again, at once: %v, want ErrUnauthenticated", err)
				}
			})
		}
		close(start)
		wg.Wait()
		for range 150 {
			if _, err := s.Authenticate(ctx, key, "client"); !errors.Is(err, payment.ErrUnauthenticated) {
				t.Fatalf("again: %v, want ErrUnauthenticated", err)
			}
		}
		if n := lookups(s) - before; n != 0 {
			t.Errorf("200 uses of a key found unknown: %d lookups, want 0", n)
		}
	}
	s.budget.mu.Lock()
	defer s.budget.mu.Unlock()
	if got, want := s.budget.buckets["client"].tokens, float64(DefaultKeyBudget.Burst-1); got < want || got >= want+1 {
		t.Errorf("the client's budget: %.2f tokens, want %d and a little refill: one spent, by the made-up key", got, int(want))
	}
}

// TestUnknownHashIsForgotten: a hash found unknown is refused from memory
// for unknownForget, even if a key with that hash appears meanwhile (an
// operator's restore; a new key cannot, its secret being random), and is
// looked up again after it, and then accepted.
func TestUnknownHashIsForgotten(t *testing.T) {
	ctx := context.Background()
	s := openBudgeted(t, KeyBudget{})
	merchant, _, err := s.RegisterMerchant(ctx, "forgotten")
	if err != nil {
		t.Fatal(err)
	}
	secret, err := newTestKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret, "client"); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Fatalf("a made-up key: %v", err)
	}
	hash := sha256.Sum256([]byte(secret))
	if _, err := s.Pool().Exec(ctx, `INSERT INTO api_keys (hash, id, merchant_id) VALUES ($1, 'key_' || md5($3), $2)`, hash[:], merchant, secret); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret, "client"); !errors.Is(err, payment.ErrUnauthenticated) {
		t.Errorf("within unknownForget: %v, want ErrUnauthenticated from memory", err)
	}
	s.unknown.mu.Lock()
	e := s.unknown.byHash[hash]
	e.Value = unknownEntry{hash: hash, until: time.Now().Add(-time.Millisecond)}
	s.unknown.mu.Unlock()
	if got, err := s.Authenticate(ctx, secret, "client"); err != nil || got != merchant {
		t.Errorf("past unknownForget: %v, %v; want the merchant", got, err)
	}
}

// TestUnknownHashesAreBounded: the memory of unknown hashes holds at most
// unknownCacheMax, the least recently used going first.
func TestUnknownHashesAreBounded(t *testing.T) {
	var c unknownHashes
	now := time.Now()
	hash := func(i int) [sha256.Size]byte { return sha256.Sum256([]byte(strconv.Itoa(i))) }
	for i := range unknownCacheMax {
		c.add(hash(i), now)
	}
	if !c.has(hash(0), now) { // used: now the most recent
		t.Fatal("the first hash is forgotten before the memory is full")
	}
	c.add(hash(unknownCacheMax), now)
	if c.lru.Len() != unknownCacheMax || len(c.byHash) != unknownCacheMax {
		t.Errorf("%d entries (%d in the map), want %d", c.lru.Len(), len(c.byHash), unknownCacheMax)
	}
	if !c.has(hash(0), now) || c.has(hash(1), now) || !c.has(hash(unknownCacheMax), now) {
		t.Error("past the bound, the least recently used hash (1) should go, the others stay")
	}
	if c.has(hash(2), now.Add(unknownForget)) {
		t.Error("a hash is remembered past unknownForget")
	}
}

// TestNewKeyWaitsForTheBudget: from an address whose budget is spent, a
// valid key this process has not seen waits for the next token and is
// accepted; when the token would come later than the budget's Wait, the key
// is refused at once, unlooked-up, with a RetryAfter of when it comes, and
// not as unauthenticated. A key already found valid is not held up.
func TestNewKeyWaitsForTheBudget(t *testing.T) {
	ctx := context.Background()
	s := openBudgeted(t, KeyBudget{Burst: 1, Rate: 4, Wait: 2 * time.Second})
	known, knownKey, err := s.RegisterMerchant(ctx, "known")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, knownKey.Secret, "client"); err != nil {
		t.Fatal(err)
	}
	spend := func() {
		t.Helper()
		madeUp, _ := newTestKey()
		if _, err := s.Authenticate(ctx, madeUp, "client"); !errors.Is(err, payment.ErrUnauthenticated) {
			t.Fatalf("a made-up key: %v", err)
		}
	}
	spend()
	fresh, freshKey, err := s.RegisterMerchant(ctx, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if got, err := s.Authenticate(ctx, freshKey.Secret, "client"); err != nil || got != fresh {
		t.Fatalf("a new key after the budget is spent: %v, %v; want it accepted after a wait", got, err)
	}
	if waited := time.Since(began); waited < 150*time.Millisecond {
		t.Errorf("the new key was looked up after %s; the next token was 250 ms away", waited)
	}

	// Past the wait bound: a token 10 s away, the bound 1 s.
	s.budget.limits, s.budget.buckets = KeyBudget{Burst: 1, Rate: 0.1, Wait: time.Second}, nil
	spend()
	_, other, err := s.RegisterMerchant(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	before := lookups(s)
	began = time.Now()
	_, err = s.Authenticate(ctx, other.Secret, "client")
	var later *payment.RetryAfter
	if !errors.As(err, &later) || !errors.Is(err, payment.ErrTooManyUnknownKeys) || errors.Is(err, payment.ErrUnauthenticated) {
		t.Fatalf("a new key, its token beyond the wait bound: %v, want a RetryAfter of ErrTooManyUnknownKeys", err)
	}
	if later.After <= time.Second || later.After > 10*time.Second {
		t.Errorf("RetryAfter %s, want when the token comes: over the 1 s bound, at most 10 s", later.After)
	}
	if took := time.Since(began); took >= later.After {
		t.Errorf("refused after %s: it waited for nothing", took)
	}
	if n := lookups(s) - before; n != 0 {
		t.Errorf("the refused key took %d lookups, want 0", n)
	}
	if got, err := s.Authenticate(ctx, knownKey.Secret, "client"); err != nil || got != known {
		t.Errorf("a key found valid, from the same address: %v, %v", got, err)
	}
}

// TestFailureBudgetIsBounded: however many addresses fail lookups, the budget
// remembers at most budgetMaxClients of them: when it is full, a new address
// first evicts the buckets that have refilled (they say nothing), and when
// none has, it starts over.
func TestFailureBudgetIsBounded(t *testing.T) {
	b := failureBudget{limits: DefaultKeyBudget}
	now := time.Now()
	fill := func(prefix string, at time.Time) {
		for i := range budgetMaxClients {
			b.charge(fmt.Sprintf("%s-%d", prefix, i), at)
		}
	}
	fill("a", now)
	if len(b.buckets) != budgetMaxClients {
		t.Fatalf("%d buckets after %d addresses, want %d", len(b.buckets), budgetMaxClients, budgetMaxClients)
	}
	// Full, and nothing refilled: a new address starts the map over.
	b.charge("new", now)
	if len(b.buckets) != 1 {
		t.Fatalf("%d buckets after one more address, want 1 (started over)", len(b.buckets))
	}
	// Full again, and by later every address but one has refilled: those go.
	b = failureBudget{limits: DefaultKeyBudget}
	fill("b", now)
	later := now.Add(time.Minute)
	for range b.limits.Burst {
		b.charge("b-0", later.Add(-time.Millisecond)) // spent just before later
	}
	b.charge("newer", later)
	if _, ok := b.buckets["b-0"]; !ok || len(b.buckets) != 2 {
		t.Errorf("%d buckets (b-0 kept: %v) after evicting refilled ones, want b-0 and newer", len(b.buckets), ok)
	}
	if d := b.untilToken("b-1", later); d != 0 {
		t.Errorf("an evicted (refilled) address waits %s for a token", d)
	}
}

// TestFailureBudgetKeepsItsDebt: lookups that passed the check together (up
// to UnknownKeyLookups run at once) and all failed are all paid for: the
// client's next token comes as late as its rate says. The budget floored
// at zero before, so each token let that many lookups through, and a flood
// ran at three times the documented rate.
func TestFailureBudgetKeepsItsDebt(t *testing.T) {
	b := failureBudget{limits: KeyBudget{Burst: 1, Rate: 10, Wait: time.Second}}
	now := time.Now()
	for range UnknownKeyLookups {
		if d := b.untilToken("a", now); d != 0 {
			t.Fatalf("the checks made together: a token in %s, want one now", d)
		}
	}
	for range UnknownKeyLookups {
		b.charge("a", now)
	}
	want := time.Duration(UnknownKeyLookups) * 100 * time.Millisecond // 1 token owed, and 1 to have, at 10 a second
	if d := b.untilToken("a", now); d != want {
		t.Errorf("after %d failures on 1 token: the next in %s, want %s", UnknownKeyLookups, d, want)
	}
}

// TestBusyLookupSlotsAreTooManyUnknownKeys: a key whose lookup waited its
// bound for a slot, every slot taken by other unknown keys, is answered 429
// too-many-unknown-keys with a Retry-After, not 503 "the database cannot be
// reached": the database was never asked.
func TestBusyLookupSlotsAreTooManyUnknownKeys(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DatabaseURL(t), Options{LookupWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for range UnknownKeyLookups {
		s.unknownSlots <- struct{}{}
	}
	key, err := newTestKey()
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, key, "client")
	var retry *payment.RetryAfter
	if !errors.Is(err, payment.ErrTooManyUnknownKeys) || errors.Is(err, payment.ErrUnavailable) || !errors.As(err, &retry) || retry.After <= 0 {
		t.Errorf("every lookup slot busy: %v, want ErrTooManyUnknownKeys with a Retry-After", err)
	}
	for range UnknownKeyLookups {
		<-s.unknownSlots
	}
}
