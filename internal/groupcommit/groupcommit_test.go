package groupcommit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder runs batches that double their items, recording each batch, and
// holds every batch until release is closed (nil: no hold).
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	release chan struct{}
	started chan struct{}
}

func (r *recorder) run(_ context.Context, items []int) ([]int, error) {
	r.mu.Lock()
	r.batches = append(r.batches, append([]int(nil), items...))
	r.mu.Unlock()
	if r.started != nil {
		r.started <- struct{}{}
	}
	if r.release != nil {
		<-r.release
	}
	outs := make([]int, len(items))
	for i, v := range items {
		outs[i] = 2 * v
	}
	return outs, nil
}

// A lone request leaves at once, alone: it never waits for company.
func TestLoneRequestLeavesAtOnce(t *testing.T) {
	r := &recorder{}
	b := New(context.Background(), r.run, Options[int, int]{})
	for i := range 3 {
		out, err := b.Do(context.Background(), i)
		if err != nil || out != 2*i {
			t.Fatalf("Do(%d) = %d, %v", i, out, err)
		}
	}
	if len(r.batches) != 3 {
		t.Fatalf("batches %v, want three batches of one", r.batches)
	}
}

// While every slot is busy, requests queue and leave together as the next
// batch, at most MaxSize at a time, each with its own answer.
func TestBusySlotsGatherABatch(t *testing.T) {
	r := &recorder{release: make(chan struct{}), started: make(chan struct{}, 100)}
	b := New(context.Background(), r.run, Options[int, int]{MaxSize: 4, Concurrency: 1})
	var wg sync.WaitGroup
	outs := make([]int, 10)
	wg.Go(func() { outs[0], _ = b.Do(context.Background(), 0) })
	<-r.started // the first batch holds the only slot
	for i := 1; i < 10; i++ {
		wg.Go(func() { outs[i], _ = b.Do(context.Background(), i) })
	}
	for b.Stats().Queued < 9 {
		time.Sleep(time.Millisecond)
	}
	close(r.release)
	wg.Wait()
	for i, out := range outs {
		if out != 2*i {
			t.Errorf("request %d got %d, want %d", i, out, 2*i)
		}
	}
	want := []int{1, 4, 4, 1}
	if len(r.batches) != len(want) {
		t.Fatalf("batches %v, want sizes %v", r.batches, want)
	}
	for i, n := range want {
		if len(r.batches[i]) != n {
			t.Errorf("batch %d has %d requests, want %d (%v)", i, len(r.batches[i]), n, r.batches)
		}
	}
}

// A request whose caller went away while it was queued is never executed.
func TestCancelledWhileQueuedNeverRuns(t *testing.T) {
	r := &recorder{release: make(chan struct{}), started: make(chan struct{}, 100)}
	b := New(context.Background(), r.run, Options[int, int]{Concurrency: 1})
	done := make(chan struct{})
	go func() { defer close(done); _, _ = b.Do(context.Background(), 1) }()
	<-r.started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { _, err := b.Do(ctx, 2); errc <- err }()
	for b.Stats().Queued < 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	close(r.release)
	<-done
	if len(r.batches) != 1 {
		t.Errorf("batches %v: the cancelled request ran", r.batches)
	}
}

// A batch that fails or panics answers every member with that failure, and
// the batcher goes on.
func TestFailureReachesEveryMember(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	b := New(context.Background(), func(_ context.Context, items []int) ([]int, error) {
		calls++
		switch calls {
		case 1:
			return nil, boom
		case 2:
			panic("bug")
		case 3:
			return []int{1, 2, 3}, nil // too many answers
		}
		return items, nil
	}, Options[int, int]{})
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, boom) {
		t.Errorf("got %v, want the batch's error", err)
	}
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, ErrPanicked) {
		t.Errorf("got %v, want ErrPanicked", err)
	}
	if _, err := b.Do(context.Background(), 1); err == nil {
		t.Error("a batch with the wrong number of answers succeeded")
	}
	if out, err := b.Do(context.Background(), 7); err != nil || out != 7 {
		t.Errorf("after the failures: %d, %v", out, err)
	}
}

// A caller whose context has already ended when it finds a slot free gives
// the slot back: the next request still runs. (Before, Do took the slot,
// found only its own cancelled request, ran no batch, and kept the slot, so
// every later charge in the process waited until its client gave up.)
func TestCancelledCallerGivesTheSlotBack(t *testing.T) {
	r := &recorder{}
	b := New(context.Background(), r.run, Options[int, int]{Concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Do(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled caller got %v, want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() {
		out, err := b.Do(context.Background(), 2)
		if err == nil && out != 4 {
			err = errors.New("wrong answer")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next request still waits after 5 s: the cancelled caller kept the slot")
	}
	if len(r.batches) != 1 {
		t.Errorf("batches %v, want only the live request's", r.batches)
	}
}

// A request queued behind a batch that does not finish leaves the queue after
// MaxWait with ErrQueueTimeout and is never executed; the batch's own member
// waits for its batch.
func TestQueueWaitIsBounded(t *testing.T) {
	r := &recorder{release: make(chan struct{}), started: make(chan struct{}, 100)}
	b := New(context.Background(), r.run, Options[int, int]{Concurrency: 1, MaxWait: 50 * time.Millisecond})
	first := make(chan error, 1)
	go func() { _, err := b.Do(context.Background(), 1); first <- err }()
	<-r.started
	start := time.Now()
	if _, err := b.Do(context.Background(), 2); !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("a request queued past MaxWait got %v, want ErrQueueTimeout", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond || waited > 5*time.Second {
		t.Errorf("it waited %v, want about MaxWait (50ms)", waited)
	}
	if st := b.Stats(); st.Queued != 0 || st.QueueTimeouts != 1 {
		t.Errorf("stats %+v: want an empty queue and one timeout", st)
	}
	time.Sleep(100 * time.Millisecond) // the first batch outlives MaxWait
	close(r.release)
	if err := <-first; err != nil {
		t.Errorf("the running batch's member got %v, want its answer", err)
	}
	if len(r.batches) != 1 {
		t.Errorf("batches %v: the timed-out request ran", r.batches)
	}
}

// A caller that leaves while its batch runs gets ErrAbandoned at once; the
// batch runs to the end, its answer reaches Options.Abandoned, and the
// neighbours get theirs.
func TestCallerLeavingARunningBatch(t *testing.T) {
	r := &recorder{release: make(chan struct{}), started: make(chan struct{}, 100)}
	type report struct{ in, out int }
	reports := make(chan report, 10)
	b := New(context.Background(), r.run, Options[int, int]{
		Concurrency: 1,
		Abandoned:   func(in, out int, err error) { reports <- report{in, out} },
	})
	hold := make(chan error, 1)
	go func() { _, err := b.Do(context.Background(), 1); hold <- err }()
	<-r.started // batch [1] holds the slot; 2 and 3 queue and leave together
	ctx, cancel := context.WithCancel(context.Background())
	leaver := make(chan error, 1)
	go func() { _, err := b.Do(ctx, 2); leaver <- err }()
	neighbour := make(chan int, 1)
	go func() { out, _ := b.Do(context.Background(), 3); neighbour <- out }()
	for b.Stats().Queued < 2 {
		time.Sleep(time.Millisecond)
	}
	r.release <- struct{}{} // batch [1] ends; batch [2 3] starts
	<-r.started
	cancel()
	if err := <-leaver; !errors.Is(err, ErrAbandoned) {
		t.Fatalf("the caller that left got %v, want ErrAbandoned", err)
	}
	select {
	case rep := <-reports:
		t.Fatalf("reported %+v before the batch answered", rep)
	default:
	}
	close(r.release)
	if err := <-hold; err != nil {
		t.Fatal(err)
	}
	if out := <-neighbour; out != 6 {
		t.Errorf("the neighbour got %d, want 6", out)
	}
	if rep := <-reports; rep != (report{2, 4}) {
		t.Errorf("Abandoned got %+v, want the answer {2 4}", rep)
	}
	if st := b.Stats(); st.Abandoned != 1 || st.Batches != 2 {
		t.Errorf("stats %+v: want one abandoned request in two batches", st)
	}
}

// Stats shows the age of a batch in flight, growing while it runs, and zero
// once the batcher is idle.
func TestStatsShowTheRunningBatch(t *testing.T) {
	r := &recorder{release: make(chan struct{}), started: make(chan struct{}, 100)}
	b := New(context.Background(), r.run, Options[int, int]{Concurrency: 1})
	if st := b.Stats(); st.BatchAge != 0 || st.QueueWait != 0 {
		t.Fatalf("idle stats %+v", st)
	}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = b.Do(context.Background(), 1) }()
	<-r.started
	go func() { _, _ = b.Do(context.Background(), 2) }()
	time.Sleep(30 * time.Millisecond)
	st := b.Stats()
	if st.BatchAge < 30*time.Millisecond {
		t.Errorf("a batch running for 30ms shows age %v", st.BatchAge)
	}
	for st.Queued == 0 {
		time.Sleep(time.Millisecond)
		st = b.Stats()
	}
	if st.QueueWait <= 0 {
		t.Errorf("a queued request shows wait %v", st.QueueWait)
	}
	close(r.release)
	<-done
	for b.Stats().BatchAge != 0 {
		time.Sleep(time.Millisecond)
	}
	if st := b.Stats(); st.Queued != 0 || st.Batches != 2 {
		t.Errorf("after the batches: %+v", st)
	}
}
