package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/payments/internal/payment"
	"github.com/exactlyonce/payments/internal/retry"
)

// Store is the delivery state the Deliverer works on, kept beside the
// outbox; *postgres.Deliveries implements it (docs/webhooks.md).
type Store interface {
	// FanOutAndLease inserts the deliveries of up to batch new events per
	// live endpoint and moves the endpoints' cursors, one fan-out at a time
	// across replicas, leases the caller those of the new deliveries that
	// lease allows, and says what it did.
	FanOutAndLease(ctx context.Context, batch int, lease payment.FanOutLease) (payment.FanOut, []payment.WebhookDelivery, error)
	// WatchEvents returns a channel that receives soon after this process
	// commits events, and a func that ends the watch.
	WatchEvents() (<-chan struct{}, func())
	// PruneWebhooks deletes up to batch of the attempts and up to batch of
	// the settled deliveries older than retention, one prune at a time
	// across replicas, and returns how many rows it deleted and whether
	// more may be due (a batch was full).
	PruneWebhooks(ctx context.Context, retention time.Duration, batch int) (deleted int64, more bool, err error)
	// ClaimDeliveries leases up to total due deliveries of endpoints that
	// are not paused, in turns across merchants, at most perMerchant per
	// merchant and per endpoint one while its attempts fail, else its
	// in-flight limit up to perEndpoint, counting those leased already.
	ClaimDeliveries(ctx context.Context, perEndpoint, perMerchant, total int, lease time.Duration) ([]payment.WebhookDelivery, error)
	// RecordAttempts records attempts, and what they say of their
	// endpoints, and settles each delivery its claim still holds, in one
	// transaction, returning their states then ("" where not held).
	RecordAttempts(ctx context.Context, outcomes []payment.WebhookOutcome) ([]string, error)
}

// DefaultBackoff spaces a delivery's attempts: the first retry within 10 s,
// then twice as far apart each time (full jitter), at most an hour.
var DefaultBackoff = retry.Policy{First: 10 * time.Second, Max: time.Hour}

// DefaultEndpointPause spaces the probes of an endpoint whose attempts fail:
// after the n-th failure in a row it gets no attempt for a wait drawn below
// a second doubled n−1 times, at most a minute; then one at a time until a
// 2xx. Its other deliveries wait meanwhile, each on its own backoff too.
var DefaultEndpointPause = retry.Policy{First: time.Second, Max: time.Minute}

// Options tune a Deliverer. Zero values take the defaults.
type Options struct {
	// AllowPrivate lets deliveries reach http and local addresses
	// (WEBHOOK_ALLOW_PRIVATE_NETWORKS; development and tests only).
	AllowPrivate bool
	// OnDelivered, if set, is called with each delivery a 2xx answered and
	// when the answer came, for the metrics; it must not block.
	OnDelivered func(d payment.WebhookDelivery, answered time.Time)
	// Timeout bounds an attempt (default DefaultTimeout, 10 s).
	Timeout time.Duration
	// PerEndpoint bounds the attempts in flight to one endpoint, across
	// replicas, from their lease to their record (default 128): an endpoint
	// starts at 4, gains one for each 2xx up to this bound, is halved by a
	// failure, and while its attempts fail gets one at a time. PerMerchant
	// bounds those of one merchant's endpoints, across replicas (default
	// 256, and at most half InFlight), so that others always find free
	// slots; InFlight bounds those of this Deliverer (default 512).
	PerEndpoint int
	PerMerchant int
	InFlight    int
	// Lease is how long a claimed delivery is this Deliverer's (default
	// 15 s, and always Timeout plus 5 s at least): a crash past it lets
	// another replica attempt it again.
	Lease time.Duration
	// FanOutBatch bounds the events fanned out per endpoint per round
	// (default 100).
	FanOutBatch int
	// FanOutEvery is the least time between two fan-outs (default 50 ms):
	// events committed in this process wake the Deliverer, and under load
	// one fan-out covers the commits of that while. Each reads the event
	// horizon (about 1.3 ms of the database's time under the bench's load):
	// at 20 ms, a 10 s round of the bench ran 471 fan-outs where 219 did the
	// same at 50 ms.
	FanOutEvery time.Duration
	// Poll is how often it looks for new events and due retries when
	// nothing woke it (default 1 s): events other processes committed wait
	// for it, unless their own Deliverer fans them out.
	Poll time.Duration
	// Backoff draws the wait before the next attempt after the attempt-th
	// failed (default DefaultBackoff.Wait).
	Backoff func(attempt int) time.Duration
	// EndpointPause draws how long an endpoint gets no attempt after its
	// failures-th failure in a row (default DefaultEndpointPause.Wait).
	EndpointPause func(failures int) time.Duration
	// RetryFor is how long after its first attempt a delivery that keeps
	// failing is abandoned and its endpoint disabled (default 3 days).
	RetryFor time.Duration
	// Retention is how long attempts and settled deliveries are kept
	// (default 30 days; serve passes EVENT_RETENTION): once a minute, one
	// replica deletes those older, PruneBatch rows at a time (default
	// 1000).
	Retention  time.Duration
	PruneBatch int
}

// DefaultRetryFor is how long a failing delivery is retried: 3 days, as
// the payment providers merchants know do.
const DefaultRetryFor = 72 * time.Hour

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.PerEndpoint <= 0 {
		o.PerEndpoint = 128
	}
	if o.InFlight <= 0 {
		o.InFlight = 512
	}
	if o.PerMerchant <= 0 {
		o.PerMerchant = 256
	}
	o.PerMerchant = max(min(o.PerMerchant, o.InFlight/2), 1)
	if o.Lease <= 0 {
		o.Lease = 15 * time.Second
	}
	o.Lease = max(o.Lease, o.Timeout+5*time.Second)
	if o.FanOutBatch <= 0 {
		o.FanOutBatch = 100
	}
	if o.FanOutEvery <= 0 {
		o.FanOutEvery = 50 * time.Millisecond
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff.Wait
	}
	if o.EndpointPause == nil {
		o.EndpointPause = DefaultEndpointPause.Wait
	}
	if o.RetryFor <= 0 {
		o.RetryFor = DefaultRetryFor
	}
	if o.Retention <= 0 {
		o.Retention = 30 * 24 * time.Hour
	}
	if o.PruneBatch <= 0 {
		o.PruneBatch = 1000
	}
	return o
}

// Stats count what a Deliverer did, for the metrics.
type Stats struct {
	Delivered atomic.Int64 // attempts answered with a 2xx
	Failed    atomic.Int64 // attempts that were not
	Abandoned atomic.Int64 // deliveries given up after the retry period
	Pruned    atomic.Int64 // rows of the record deleted after the retention
}

// Deliverer POSTs merchants' events to their webhook endpoints: it fans new
// events out to deliveries, claims due ones under a lease, sends each
// (signed afresh) with the client NewClient builds, and records every
// attempt with the delivery's next step. Every replica may run one: the
// store's leases keep them from attempting one delivery at once.
type Deliverer struct {
	store   Store
	log     *slog.Logger
	opts    Options
	client  *http.Client
	records *retry.Outage
	prunes  *retry.Outage

	Stats Stats
}

// NewDeliverer returns a Deliverer working on store.
func NewDeliverer(store Store, log *slog.Logger, opts Options) *Deliverer {
	opts = opts.withDefaults()
	return &Deliverer{
		store: store, log: log, opts: opts,
		client:  NewClient(opts.AllowPrivate, opts.Timeout),
		records: retry.NewOutage(log, "webhooks: record attempts"),
		prunes:  retry.NewOutage(log, "webhooks: prune the record"),
	}
}

// Run delivers, and once a minute prunes the record, until ctx ends; then it
// waits for the attempts in flight (each ends within the timeout, and its
// record's last try within 5 s more) and returns. The store's failures are
// retried with the service's backoff and logged as one outage.
func (d *Deliverer) Run(ctx context.Context) {
	committed, unwatch := d.store.WatchEvents()
	defer unwatch()
	pruned := make(chan struct{})
	go func() { defer close(pruned); d.pruneLoop(ctx, pruneEvery) }()
	defer func() { <-pruned }()
	// The recorder outlives the attempts: each is recorded, even the ones
	// ctx's end cut short of their record (the deferred calls run last
	// first).
	toRecord, recorded := make(chan toRecord), make(chan struct{})
	go func() { defer close(recorded); d.recordLoop(ctx, toRecord) }()
	defer func() { <-recorded }()
	defer close(toRecord)
	loop := retry.NewLoop(d.log, "webhooks: fan out and claim deliveries", retry.Default)
	slots := make(chan struct{}, d.opts.InFlight) // one per attempt in flight
	freed := make(chan struct{}, 1)               // an attempt ended: a slot is free
	var (
		wg    sync.WaitGroup
		sched = schedule{every: d.opts.FanOutEvery, poll: d.opts.Poll, fanSoon: true, claimSoon: true}
	)
	defer wg.Wait()
	for ctx.Err() == nil {
		claimed, err := d.claim(ctx, cap(slots)-len(slots), &sched)
		for _, dl := range claimed {
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.attempt(ctx, dl, toRecord)
				<-slots
				select {
				case freed <- struct{}{}:
				default:
				}
			}()
		}
		if err != nil {
			if ctx.Err() != nil || !loop.Fail(ctx, err) {
				return
			}
			continue
		}
		loop.Succeed()
		if sched.claimSoon && len(slots) < cap(slots) {
			continue // more may be due now
		}
		timer := time.NewTimer(sched.wait(time.Now(), cap(slots)-len(slots)))
		select {
		case <-ctx.Done():
		case <-freed:
			sched.claimSoon = true
		case <-committed:
			sched.fanSoon = !sched.idle
		case <-timer.C:
		}
		timer.Stop()
	}
}

// schedule says when a Deliverer's loop fans out and when it claims, so
// that waking costs a transaction only when one may find work. A fan-out is
// due every poll, and every so often after events committed here or when
// the last one asked for another (payment.FanOut.Again, or it created
// deliveries: more may follow). A claim is due every poll (for retries come
// due), and at once when an attempt ended (its slot is free), when a
// fan-out created deliveries, or when the last claim took some (more may be
// due). A commit whose fan-out is not due yet costs nothing, nor does one
// while the last fan-out found no live endpoint (idle): the poll's fan-out
// finds the first endpoint created, and its first events, within a second.
type schedule struct {
	every, poll time.Duration
	fannedAt    time.Time // the last fan-out
	fanSoon     bool      // a fan-out is wanted sooner than the poll
	claimedAt   time.Time // the last claim
	claimSoon   bool      // a claim is wanted at once
	idle        bool      // the last fan-out found no live endpoint
}

// nextFanOut is when the next fan-out may run.
func (s *schedule) nextFanOut() time.Time {
	if s.fanSoon {
		return s.fannedAt.Add(s.every)
	}
	return s.fannedAt.Add(s.poll)
}

// claimDue says whether a claim is due now, with free slots.
func (s *schedule) claimDue(now time.Time, free int) bool {
	return free > 0 && (s.claimSoon || !now.Before(s.claimedAt.Add(s.poll)))
}

// wait is how long the loop may sleep from now: until the next fan-out, or
// the next claim by the poll if a slot is free.
func (s *schedule) wait(now time.Time, free int) time.Duration {
	wait := s.nextFanOut().Sub(now)
	if free > 0 {
		wait = min(wait, s.claimedAt.Add(s.poll).Sub(now))
	}
	return max(wait, 0)
}

// claim fans new events out if a fan-out is due, leasing what it may of
// the deliveries it creates, then claims up to the slots still free of the
// due deliveries if a claim is due (schedule). It returns what it leased
// even with the error of a claim that followed.
func (d *Deliverer) claim(ctx context.Context, free int, s *schedule) ([]payment.WebhookDelivery, error) {
	now := time.Now()
	var leased []payment.WebhookDelivery
	if !now.Before(s.nextFanOut()) {
		r, l, err := d.store.FanOutAndLease(ctx, d.opts.FanOutBatch, payment.FanOutLease{
			PerEndpoint: d.opts.PerEndpoint, PerMerchant: d.opts.PerMerchant, Total: free, For: d.opts.Lease})
		if err != nil {
			return nil, err
		}
		leased, free = l, free-len(l)
		s.fannedAt, s.fanSoon, s.idle = now, r.Again || r.Created > 0, r.Idle
		s.claimSoon = s.claimSoon || r.Created > r.Leased
	}
	if !s.claimDue(now, free) {
		return leased, nil
	}
	claimed, err := d.store.ClaimDeliveries(ctx, d.opts.PerEndpoint, d.opts.PerMerchant, free, d.opts.Lease)
	if err != nil {
		return leased, err
	}
	s.claimedAt, s.claimSoon = now, len(claimed) > 0
	return append(leased, claimed...), nil
}

// attempt POSTs one delivery and has the recorder record the attempt,
// waiting for it. An attempt cut short by ctx's end is not recorded: its
// lease expires and it is made again.
func (d *Deliverer) attempt(ctx context.Context, dl payment.WebhookDelivery, recorder chan<- toRecord) {
	a := d.post(ctx, dl)
	if ctx.Err() != nil && a.Error != "" {
		return
	}
	if a.Delivered() {
		d.Stats.Delivered.Add(1)
		if d.opts.OnDelivered != nil {
			d.opts.OnDelivered(dl, a.At.Add(a.Latency))
		}
	} else {
		d.Stats.Failed.Add(1)
		a.RetryIn = d.opts.Backoff(dl.Attempt)
		a.PauseFor = d.opts.EndpointPause(dl.EndpointFailures + 1)
		d.log.Debug("webhooks: attempt failed", "endpoint", dl.EndpointID, "event", dl.EventID,
			"attempt", dl.Attempt, "status", a.Status, "error", a.Error, "retry_in", a.RetryIn)
	}
	a.RetryFor, a.InFlightUpTo = d.opts.RetryFor, d.opts.PerEndpoint
	done := make(chan recordedAs, 1)
	recorder <- toRecord{payment.WebhookOutcome{Delivery: dl, Attempt: a}, done}
	r := <-done
	if r.err != nil {
		return
	}
	state := r.state
	if state == payment.DeliveryAbandoned {
		d.Stats.Abandoned.Add(1)
		d.log.Warn("webhooks: delivery abandoned after the retry period; endpoint disabled",
			"merchant", dl.MerchantID, "endpoint", dl.EndpointID, "event", dl.EventID, "attempts", dl.Attempt)
	}
}

// pruneEvery is how often a Deliverer prunes the webhook record.
const pruneEvery = time.Minute

// pruneLoop prunes the record at once and then every period until ctx
// ends; a failure waits for the next period.
func (d *Deliverer) pruneLoop(ctx context.Context, period time.Duration) {
	for {
		d.prune(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// prune deletes what is older than the retention, a batch at a time.
func (d *Deliverer) prune(ctx context.Context) {
	for ctx.Err() == nil {
		n, more, err := d.store.PruneWebhooks(ctx, d.opts.Retention, d.opts.PruneBatch)
		if err != nil {
			if ctx.Err() == nil {
				d.prunes.Failed(err)
			}
			return
		}
		d.prunes.Succeeded()
		d.Stats.Pruned.Add(n)
		if !more {
			return
		}
	}
}

// post sends the delivery once, signed now, and says what became of it.
func (d *Deliverer) post(ctx context.Context, dl payment.WebhookDelivery) payment.WebhookAttempt {
	start := time.Now()
	a := payment.WebhookAttempt{ID: payment.NewID(), At: start}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dl.URL, bytes.NewReader(dl.Body))
	if err != nil {
		a.Error = "the endpoint's URL cannot be requested"
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(EventIDHeader, payment.FormatID(payment.PrefixEvent, dl.EventID))
	req.Header.Set(SignatureHeader, Sign(dl.Secret, start, dl.Body))
	res, err := d.client.Do(req)
	if err == nil {
		// Read a little of the answer, so the connection can be used
		// again; a longer one closes it.
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxResponseBody))
		_ = res.Body.Close()
		a.Status = res.StatusCode
	}
	a.Latency = time.Since(start)
	if err != nil {
		a.Error = describe(err, d.opts.Timeout)
	}
	return a
}

// describe says why an attempt got no answer, for the merchant's record of
// attempts: without the URL, which the record already names.
func describe(err error, timeout time.Duration) string {
	if strings.Contains(err.Error(), "server response headers exceeded") {
		return fmt.Sprintf("answered with headers over %d KiB", maxResponseHeader>>10)
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return "no answer within " + timeout.String()
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	return err.Error()
}
