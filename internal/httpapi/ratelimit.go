package httpapi

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// MerchantBudget is how many requests a second this replica serves each
// merchant: Reads (GET and HEAD) and Writes (every other method) apart, so
// that a merchant's polling never spends what its charges need. Each has a
// burst of one second's worth. Zero is no limit. It is counted per replica:
// behind a load balancer spreading a merchant's requests over n replicas,
// the merchant gets up to n times as much.
//
// A request past its budget waits for its turn, up to Wait (default
// DefaultBudgetWait): a burst a little over the budget is spread out, not
// refused. One whose turn is further off is answered 429 rate-limited, and
// only after Wait, so that a client that does not honour Retry-After (a
// loop at full speed) makes one attempt per connection per Wait, not
// thousands a second that would take the CPU from every other merchant.
type MerchantBudget struct {
	Reads, Writes float64
	Wait          time.Duration
}

// DefaultBudgetWait is MerchantBudget's Wait when zero: a quarter of a
// second spreads a burst of a quarter over the budget, and holds a client
// that does not wait to 4 refused attempts a second per connection.
const DefaultBudgetWait = 250 * time.Millisecond

// DefaultMerchantBudget is the budget the settings default to
// (RATE_LIMIT_READS, RATE_LIMIT_WRITES). Reads: Stripe's live-mode rate,
// 100 a second, enough to poll every object a merchant's charges make at
// this replica's charge rate. Writes: 1,000 charges a second, an eighth of
// what one replica commits on a 2-core machine (docs/benchmarks.md), so no
// one merchant's writes can take the service from the others.
var DefaultMerchantBudget = MerchantBudget{Reads: 100, Writes: 1000}

// merchantLimits holds each merchant's token buckets. Their number is the
// number of merchants that made an authenticated request, which only an
// operator can raise (merchants create): it needs no bound of its own.
type merchantLimits struct {
	budget MerchantBudget
	mu     sync.Mutex
	byID   map[uuid.UUID]*merchantBuckets
}

type merchantBuckets struct{ reads, writes *rate.Limiter }

func newMerchantLimits(b MerchantBudget) *merchantLimits {
	return &merchantLimits{budget: b, byID: make(map[uuid.UUID]*merchantBuckets)}
}

// isRead says which budget a request of method spends.
func isRead(method string) bool { return method == http.MethodGet || method == http.MethodHead }

// budgetKind names the budget a request of method spends: reads or writes.
func budgetKind(method string) string {
	if isRead(method) {
		return "reads"
	}
	return "writes"
}

// take spends one token of merchant's budget for method, waiting for it up
// to the budget's Wait; past that it returns, after the Wait, a
// *payment.RetryAfter of payment.ErrRateLimited, having spent nothing. A
// ctx done meanwhile returns its error.
func (l *merchantLimits) take(ctx context.Context, merchant uuid.UUID, method string) error {
	kind := budgetKind(method)
	perSecond := l.budget.Writes
	if kind == "reads" {
		perSecond = l.budget.Reads
	}
	if perSecond <= 0 {
		return nil
	}
	l.mu.Lock()
	b, ok := l.byID[merchant]
	if !ok {
		b = &merchantBuckets{reads: newBucket(l.budget.Reads), writes: newBucket(l.budget.Writes)}
		l.byID[merchant] = b
	}
	l.mu.Unlock()
	lim := b.writes
	if kind == "reads" {
		lim = b.reads
	}
	now := time.Now()
	r := lim.ReserveN(now, 1)
	turn := r.DelayFrom(now)
	if turn == 0 {
		return nil
	}
	wait := cmp.Or(l.budget.Wait, DefaultBudgetWait)
	if turn <= wait {
		if !retry.Sleep(ctx, turn) {
			r.Cancel()
			return ctx.Err()
		}
		return nil
	}
	r.CancelAt(now)
	if !retry.Sleep(ctx, wait) {
		return ctx.Err()
	}
	return &payment.RetryAfter{Err: fmt.Errorf("%w: your merchant may make %g %s a second on this replica; this request was not looked at",
		payment.ErrRateLimited, perSecond, kind), After: turn - wait}
}

// newBucket is a token bucket of perSecond tokens a second holding one
// second's worth; nil for no limit.
func newBucket(perSecond float64) *rate.Limiter {
	if perSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), int(math.Max(1, math.Ceil(perSecond))))
}
