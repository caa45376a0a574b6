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
// records over [since, until) and stores the run's counts. It reads the
// processor first: every payment there was made for an operation we had
// committed before the call, so reading ours after finds it. It returns an
// error, storing nothing, when either side cannot be read.
func Reconcile(ctx context.Context, store Store, records processor.Records, name string, since, until time.Time, o Options) (Report, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	payments, err := records.Payments(ctx, since, until.Add(o.Lag))
	if err != nil {
		return Report{}, fmt.Errorf("read the processor's payments: %w", err)
	}
	refs := make([]string, 0, len(payments))
	for _, p := range payments {
		if p.Reference != "" {
			refs = append(refs, p.Reference)
		}
	}
	ours, err := store.Operations(ctx, name, since, until, refs)
	if err != nil {
		return Report{}, fmt.Errorf("read our operations: %w", err)
	}
	lines := Compare(ours, payments, Window{Since: since, Until: until, Now: now(), Settle: o.Settle})
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
