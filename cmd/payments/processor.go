package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/metrics"
	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/processor"
	"github.com/exactlyonce/payments/internal/processor/stripeproc"
)

// processorRoom: the card processor that charges by payment_method go to.
func (c *config) processorRoom() room {
	return room{roomProcessor, "Card processor", "Charges by `payment_method` go to a card processor " +
		"(see [Card processors](processors.md)): the simulator or Stripe (`PROCESSOR`); without one they are refused with `400 no-card-processor`. " +
		"Every operation records the processor it went to, and only that processor is asked about it again " +
		"([one processor per operation](processors.md#one-processor-per-operation)): change `PROCESSOR_URL` only once no card " +
		"operation is open, or keep a replica on the former one until its operations are final.", []setting{
		{"PROCESSOR", "processor", "", "the card processor: `simulator` (at `PROCESSOR_URL`), `stripe` (the `STRIPE_` settings) or `none`; " +
			"empty: `simulator` when `PROCESSOR_URL` is set, else `none`. Settings of another processor than this one are refused",
			parser{"name", func(v string) error {
				switch v {
				case "", processorNone, processorSimulator, processorStripe:
					c.Processor.Kind = v
					return nil
				}
				return fmt.Errorf("want simulator, stripe or none, got %q", v)
			}}},
		{"PROCESSOR_URL", "processor-url", "", "base URL of the card processor simulator (`procsim serve`: `http://127.0.0.1:8090`); " +
			"empty: none",
			parser{"url", func(v string) error {
				c.Processor.URL = v
				if v == "" {
					return nil
				}
				if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return fmt.Errorf("want an http or https URL, got %q", v)
				}
				return nil
			}}},
		{"PROCESSOR_WAIT", "processor-wait", "5s", "how long a card charge's request waits for the processor's outcome before `202` with the charge " +
			"`processing` (the charge goes on); refused above " + code(maxKeyWait),
			durationInto(&c.Processor.Wait)},
		{"PROCESSOR_TIMEOUT", "processor-timeout", "30s", "bound of each call to the processor; a call past it has an unknown outcome, " +
			"which recovery resolves",
			durationInto(&c.Processor.Timeout)},
		{"PROCESSOR_DECISION_DEADLINE", "processor-decision-deadline", "120s", "the processor's decision deadline (the simulator's " +
			"`-decision-deadline`, Adyen's 120 s): past it, a charge the processor has no record of failed, and one whose outcome stays unknown is reversed; " +
			"refused unless above `PROCESSOR_TIMEOUT`",
			durationInto(&c.Processor.DecisionDeadline)},
		{"PROCESSOR_WEBHOOK_SECRET", "processor-webhook-secret", "", "verifies the processor's webhooks at `POST /v1/processor/events` " +
			"(the simulator's `-webhook-secret`); empty: every webhook is refused, and recovery's lookups alone resolve asynchronous outcomes",
			parser{"secret", func(v string) error { c.Processor.WebhookSecret = v; return nil }}},
		{"STRIPE_API_KEY", "stripe-api-key", "", "with `PROCESSOR=stripe`: the account's secret key (`sk_live_...`, `sk_test_...`); never logged",
			parser{"secret", func(v string) error { c.Processor.Stripe.APIKey = v; return nil }}},
		{"STRIPE_API_BASE", "stripe-api-base", "", "with `PROCESSOR=stripe`: where Stripe's API is, when not `https://api.stripe.com` " +
			"(stripe-mock, a proxy)",
			parser{"url", func(v string) error {
				c.Processor.Stripe.APIBase = v
				if v == "" {
					return nil
				}
				if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return fmt.Errorf("want an http or https URL, got %q", v)
				}
				return nil
			}}},
		{"STRIPE_ACCOUNT", "stripe-account", "", "with `PROCESSOR=stripe`: the account's id (`acct_...`), which names the processor of every " +
			"operation sent to it; empty: asked of Stripe at start (`GET /v1/account`), and the service does not start while Stripe cannot say",
			parser{"account", func(v string) error {
				c.Processor.Stripe.Account = v
				if v != "" && !strings.HasPrefix(v, "acct_") {
					return fmt.Errorf("want a Stripe account id (acct_...), got %q", v)
				}
				return nil
			}}},
		{"STRIPE_WEBHOOK_SECRET", "stripe-webhook-secret", "", "with `PROCESSOR=stripe`: the signing secret (`whsec_...`) of the webhook endpoint " +
			"`POST /v1/processor/stripe/events`; empty: every Stripe webhook is refused, and recovery's lookups alone resolve outcomes",
			parser{"secret", func(v string) error { c.Processor.Stripe.WebhookSecret = v; return nil }}},
		{"RECOVERY_INTERVAL", "recovery-interval", "1s", "how often each replica looks for card charges whose outcome is due for a check " +
			"(a lookup, a re-drive, a reversal); at least `10ms`",
			durationAtLeast(&c.Processor.RecoveryInterval, 10*time.Millisecond)},
	}}
}

// The processors PROCESSOR names.
const (
	processorNone      = "none"
	processorSimulator = "simulator"
	processorStripe    = "stripe"
)

// kind is the processor configured: PROCESSOR, else the simulator when
// PROCESSOR_URL is set, else none.
func (p processorConfig) kind() string {
	switch {
	case p.Kind != "":
		return p.Kind
	case p.URL != "":
		return processorSimulator
	}
	return processorNone
}

// configuredProcessor is a processor's adapter: its calls (the port) and
// its own records (reconciliation).
type configuredProcessor interface {
	processor.Processor
	processor.Records
}

// openProcessor returns the adapter of the processor PROCESSOR names,
// calling through client, or nil for none. Stripe's account is asked of
// Stripe, within PROCESSOR_TIMEOUT, when STRIPE_ACCOUNT is empty; its
// refusals are logged to log.
func openProcessor(ctx context.Context, p processorConfig, client *http.Client, log *slog.Logger) (configuredProcessor, error) {
	switch p.kind() {
	case processorSimulator:
		return processor.NewSimulator(p.URL, client), nil
	case processorStripe:
		sctx, cancel := context.WithTimeout(ctx, p.Timeout)
		defer cancel()
		s, err := stripeproc.New(sctx, stripeproc.Config{APIKey: p.Stripe.APIKey, APIBase: p.Stripe.APIBase,
			Account: p.Stripe.Account, HTTPClient: client, Log: log})
		if err != nil {
			return nil, err // not a nil *Stripe in the interface
		}
		return s, nil
	}
	return nil, nil
}

// openCards returns the card charge use case over store, with the
// processor PROCESSOR names (none: card charges are refused), its metrics
// on m.
func openCards(ctx context.Context, cfg config, store *postgres.Store, log *slog.Logger, m *metrics.Metrics) (*cards.Cards, error) {
	p := cfg.Processor
	o := cards.Options{Render: httpapi.RenderCardCharge, RenderOperation: httpapi.RenderCardOperation, WebhookSecret: p.WebhookSecret,
		Wait: p.Wait, KeyWait: cfg.Pool.KeyWait, CallTimeout: p.Timeout, DecisionDeadline: p.DecisionDeadline,
		Interval: p.RecoveryInterval, KeyTTL: cfg.Keys.TTL, OnResolved: m.ProcessorResolved(), Log: log}
	proc, err := openProcessor(ctx, p, processorClient(), log)
	if err != nil {
		return nil, err
	}
	if proc != nil {
		o.Processor = proc
		if p.kind() == processorStripe {
			o.Webhooks = stripeproc.Webhooks{Secret: p.Stripe.WebhookSecret}
		}
		log.Info("card processor", "processor", proc.Name())
	}
	c := cards.New(store.Cards, o)
	cardMetrics(m, &c.Stats)
	return c, nil
}

// processorIdleConns is how many idle connections to the processor are
// kept: about the calls in flight at a busy moment (a load of 256 card
// charges at once keeps that many).
const processorIdleConns = 256

// processorClient keeps its connections to the processor. Go's default
// transport keeps 2 idle connections per host, so that at a few hundred
// calls at once nearly every call dialed a connection of its own, which
// doubles a call's round trips and costs CPU at both ends. Go's transport
// may send a keyed request again on a reused connection that closed before
// any answer came; the processor answers it from its idempotency key.
func processorClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = processorIdleConns, processorIdleConns
	return &http.Client{Transport: t}
}

// cardMetrics registers the card charges' recovery series, read from s.
func cardMetrics(m *metrics.Metrics, s *cards.Stats) {
	for name, f := range map[string]struct {
		help string
		v    func() int64
	}{
		"payments_processor_lookups_total":           {"Lookups by our reference this process made at the card processor (recovery).", s.Lookups.Load},
		"payments_processor_redrives_total":          {"Operations recovery sent again with their processor key: authorizations the processor had no record of yet, and captures, voids and refunds whose outcome was unknown.", s.Redrives.Load},
		"payments_processor_reversal_attempts_total": {"Reversals by our reference this process asked of the card processor, accepted or not.", s.Reversals.Load},
		"payments_processor_key_mismatches_total":    {"Calls the card processor refused because one of our processor keys came again with other parameters: a bug of ours (the operation stays open; docs/processors.md, Stripe).", s.KeyMismatches.Load},
		"payments_processor_reviews_total":           {"Operations this process sent to review: a card charge whose reversal was refused too often, or a capture, void or refund unknown past its review bound.", s.Reviews.Load},
	} {
		m.CounterFunc(name, f.help, func() float64 { return float64(f.v()) })
	}
	m.GaugeFunc("payments_processor_operations_open", "Operations at the card processor still open (processing or reversing), as recovery last counted (every RECOVERY_INTERVAL).",
		func() float64 { return float64(s.Open.Load()) })
	m.GaugeFunc("payments_processor_operations_in_review", "Operations at the card processor in requires_review (card charges, captures, voids, refunds), which an operator settles, as recovery last counted.",
		func() float64 { return float64(s.InReview.Load()) })
	m.GaugeFunc("payments_processor_oldest_open_seconds", "Age of the oldest open operation at the card processor, as recovery last read it.",
		func() float64 { return time.Duration(s.OldestOpen.Load()).Seconds() })
}
