package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/payments/internal/processor"
)

// Store is what a reconciliation needs of our database: internal/postgres
// implements it.
type Store interface {
	// Operations returns our authorizations at processor (and those made
	// before operations named their processor) created in [since, until),
	// and those whose reference is in refs, with their charges as they are.
	Operations(ctx context.Context, processor string, since, until time.Time, refs []string) ([]Operation, error)
	// RecordRun stores a finished run's counts, for the service's metrics,
	// and returns when it finished by the store's clock.
	RecordRun(ctx context.Context, r Run) (time.Time, error)
}

// Run is one reconciliation as it is stored: what it covered, when it
// finished and what it counted.
type Run struct {
	Processor    string
	Since, Until time.Time
	FinishedAt   time.Time
	Counts       map[Result]int
}

// Mismatches is how many references disagree.
func (r Run) Mismatches() int {
	n := 0
	for res, c := range r.Counts {
		if res.Mismatch() {
			n += c
		}
	}
	return n
}

// Report is a finished reconciliation: the run and its lines.
type Report struct {
	Run
	Settle time.Duration
	Lines  []Line
}

// Options are a reconciliation's bounds.
type Options struct {
	// Settle is how old an operation must be to be judged: a younger one
	// is pending.
	Settle time.Duration
	// Lag is how long after our operation the processor may create its
	// payment (a re-drive before the decision deadline): payments are read
	// up to Until+Lag.
	Lag time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Reconcile compares our operations at the processor named name with its
// records over [since, until) and stores the run's counts. Each pass reads
// the processor first: every payment there was made for an operation we
// had committed before the call, so reading ours after finds it. A pass
// that finds mismatches is read again, and only what disagrees in both is
// reported as such: a capture or refund that ended between the two reads
// of a pass is pending. It returns an error, storing nothing, when either
// side cannot be read.
func Reconcile(ctx context.Context, store Store, records processor.Records, name string, since, until time.Time, o Options) (Report, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	lines, err := pass(ctx, store, records, name, since, until, o)
	if err != nil {
		return Report{}, err
	}
	if mismatched(lines) {
		again, err := pass(ctx, store, records, name, since, until, o)
		if err != nil {
			return Report{}, err
		}
		lines = confirm(lines, again)
	}
	r := Report{Run: Run{Processor: name, Since: since, Until: until, Counts: map[Result]int{}}, Settle: o.Settle, Lines: lines}
	for _, res := range Results {
		r.Counts[res] = 0
	}
	for _, l := range lines {
		r.Counts[l.Result]++
	}
	if r.FinishedAt, err = store.RecordRun(ctx, r.Run); err != nil {
		return Report{}, fmt.Errorf("record the run: %w", err)
	}
	return r, nil
}

// pass reads both sides once, the processor first, and compares them.
func pass(ctx context.Context, store Store, records processor.Records, name string, since, until time.Time, o Options) ([]Line, error) {
	payments, err := records.Payments(ctx, since, until.Add(o.Lag))
	if err != nil {
		return nil, fmt.Errorf("read the processor's payments: %w", err)
	}
	refs := make([]string, 0, len(payments))
	for _, p := range payments {
		if p.Reference != "" {
			refs = append(refs, p.Reference)
		}
	}
	ours, err := store.Operations(ctx, name, since, until, refs)
	if err != nil {
		return nil, fmt.Errorf("read our operations: %w", err)
	}
	return Compare(ours, payments, Window{Since: since, Until: until, Now: o.Now(), Settle: o.Settle}), nil
}

func mismatched(lines []Line) bool {
	for _, l := range lines {
		if l.Result.Mismatch() {
			return true
		}
	}
	return false
}

// confirm returns the second pass's lines, a mismatch of which the first
// pass did not find being pending: the reference changed while it was read.
func confirm(first, second []Line) []Line {
	before := map[string]bool{}
	for _, l := range first {
		before[l.Reference+" "+psp(l)] = l.Result.Mismatch()
	}
	for i, l := range second {
		if l.Result.Mismatch() && !before[l.Reference+" "+psp(l)] {
			second[i].Result, second[i].Detail = Pending, "changed while it was read ("+string(l.Result)+": "+l.Detail+")"
		}
	}
	return second
}
