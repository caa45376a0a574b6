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
	b := New(context.Background(), r.run, Options{})
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
	b := New(context.Background(), r.run, Options{MaxSize: 4, Concurrency: 1})
	var wg sync.WaitGroup
	outs := make([]int, 10)
	wg.Go(func() { outs[0], _ = b.Do(context.Background(), 0) })
	<-r.started // the first batch holds the only slot
	for i := 1; i < 10; i++ {
		wg.Go(func() { outs[i], _ = b.Do(context.Background(), i) })
	}
	for b.queued() < 9 {
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
	b := New(context.Background(), r.run, Options{Concurrency: 1})
	done := make(chan struct{})
	go func() { defer close(done); _, _ = b.Do(context.Background(), 1) }()
	<-r.started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { _, err := b.Do(ctx, 2); errc <- err }()
	for b.queued() < 1 {
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
	}, Options{})
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
