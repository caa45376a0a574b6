package cards

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/exactlyonce/payments/internal/cards/carddb"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/retry"
)

// Recovery. Every open operation (processing, reversing) has a next check;
// Run, on every replica, claims the due ones with a lease (the claim moves
// their next check past the calls it makes, committed before it makes them)
// and resolves each, holding nothing while it calls the processor:
//
//   - processing: a lookup by our reference. An approval found is applied; a
//     decline, or a payment the processor cancelled (its decision deadline),
//     fails the charge. Found pending: checked again later. Not found before
//     the decision deadline less a call's bound: the authorization is sent
//     again with the same processor key (it cannot be done twice); not found
//     after the deadline: the charge failed (processor-no-record). The
//     lookup itself failing past the deadline: the outcome stays unknown, so
//     the charge is reversed.
//   - reversing: a reversal by our reference, under a key of its round;
//     refused ReversalAttempts times, the charge goes to review.
//
// Checks back off from Backoff, doubling, up to MaxBackoff.

// ours reports whether an operation recorded as sent to processor is this
// service's processor's to look up, re-drive or reverse: an operation
// names none when it was made before operations named theirs.
func (c *Cards) ours(processor string) bool {
	return processor == "" || processor == c.opts.Processor.Name()
}

// claimBatch is the most operations one claim leases.
const claimBatch = 32

// Run resolves due operations every Interval until ctx ends. It does
// nothing without a processor.
func (c *Cards) Run(ctx context.Context) {
	if c.opts.Processor == nil {
		return
	}
	loop := retry.NewLoop(c.opts.Log, "card charge recovery", retry.Periodic(c.opts.Interval))
	for {
		n, err := c.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !loop.Fail(ctx, err) {
				return
			}
			continue
		}
		loop.Succeed()
		if n == claimBatch {
			continue // more may be due
		}
		if !retry.Sleep(ctx, c.opts.Interval) {
			return
		}
	}
}

// RunOnce claims the due operations once, resolves them, and reads the
// open operations for Stats. It returns how many it claimed.
func (c *Cards) RunOnce(ctx context.Context) (int, error) {
	open, err := c.store.Open(ctx)
	if err != nil {
		return 0, err
	}
	c.Stats.Open.Store(int64(open.Open))
	c.Stats.InReview.Store(int64(open.InReview))
	c.Stats.OldestOpen.Store(int64(open.Oldest))
	ops, err := c.store.Claim(ctx, c.opts.Processor.Name(), c.lease(), claimBatch)
	if err != nil {
		return 0, err
	}
	fetched := time.Now()
	for _, op := range ops {
		if err := c.check(ctx, op, fetched); err != nil {
			c.opts.Log.Warn("card charge check failed; it is checked again after its lease",
				"charge_id", reference(op), "state", string(op.State), "error", err)
		}
	}
	return len(ops), nil
}

// check resolves one claimed operation as far as the processor lets it.
func (c *Cards) check(ctx context.Context, op carddb.Operation, fetched time.Time) error {
	if !c.ours(op.Processor) {
		return fmt.Errorf("operation of processor %q claimed by %q's recovery", op.Processor, c.opts.Processor.Name())
	}
	if op.Kind != carddb.KindAuthorize {
		return c.checkFollowUp(ctx, op, fetched)
	}
	if op.State == carddb.Reversing {
		c.Stats.Reversals.Add(1)
		cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		key := processorKey(op.ID, "reverse-"+strconv.Itoa(op.ReversalRound))
		res := c.counted(c.opts.Processor.Reverse(cctx, key, reference(op)))
		cancel()
		o := outcome{kind: reversalRefused, code: res.Code}
		if res.Outcome == processor.Approved {
			o = outcome{kind: reversalOK}
		}
		return c.apply(ctx, op, fetched, o, carddb.Inbound{})
	}
	o, err := c.lookup(ctx, op, fetched)
	if err != nil {
		return err
	}
	return c.apply(ctx, op, fetched, o, carddb.Inbound{})
}

// codeLookupFailed is the code of an outcome left unknown because the lookup
// itself failed.
const codeLookupFailed = "lookup_failed"

// lookup finds what the processor did under op's reference, and re-drives
// the authorization when it has no record of it yet.
func (c *Cards) lookup(ctx context.Context, op carddb.Operation, fetched time.Time) (outcome, error) {
	c.Stats.Lookups.Add(1)
	cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	found, err := c.opts.Processor.Lookup(cctx, reference(op))
	cancel()
	now := op.Now.Add(time.Since(fetched))
	switch {
	case err != nil && !errors.Is(err, processor.ErrUnknown):
		return outcome{}, err
	case err != nil && now.After(op.DecisionDeadline):
		return outcome{kind: giveUp, code: codeLookupFailed}, nil
	case err != nil:
		return outcome{kind: unknown, code: codeLookupFailed}, nil
	}
	if o, ok := outcomeOfPayments(found); ok {
		return o, nil
	}
	switch {
	case now.Before(op.DecisionDeadline.Add(-c.opts.CallTimeout)):
		c.Stats.Redrives.Add(1)
		cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		res := c.counted(c.opts.Processor.Authorize(cctx, authorization(op)))
		cancel()
		return outcomeOf(res), nil
	case now.Before(op.DecisionDeadline):
		// Too late to send it again, too early to tell: look once the
		// deadline has passed.
		return outcome{kind: unknown, code: "not_found", after: op.DecisionDeadline.Sub(now) + c.opts.Poll}, nil
	}
	return outcome{kind: noRecord}, nil
}

// outcomeOfPayments is what the payments carrying our reference say: an
// approval wins over anything else, then a decline, a pending decision, a
// cancellation. It reports false when there is none.
func outcomeOfPayments(ps []processor.Payment) (outcome, bool) {
	var best outcome
	rank := 0
	for _, p := range ps {
		o, r := outcome{payment: p}, 0
		switch p.Status {
		case "authorized", "captured":
			o.kind, r = approved, 4
		case "declined":
			o.kind, o.code, r = declined, p.DeclineCode, 3
		case "pending":
			o.kind, o.code, r = unknown, "pending", 2
		default: // expired, voided, reversed: cancelled by the processor
			o.kind, o.code, r = cancelled, p.Status, 1
		}
		if r > rank {
			best, rank = o, r
		}
	}
	return best, rank > 0
}
