// Package stripeproc is the processor port's adapter for Stripe
// (processor.Processor and processor.Records), through stripe-go: an
// authorization is a PaymentIntent created and confirmed at once under our
// operation's processor key (Stripe's Idempotency-Key) with our reference in
// its metadata, captured later when it was created with capture_method
// manual; a void cancels it; a refund is a Refund of it. A lookup by our
// reference is a search on that metadata, which Stripe indexes within about
// a minute: found nothing, it proves nothing, and the use case sends the
// authorization again under the same key, which Stripe answers from its
// first answer for 24 hours (docs/processors.md, "Stripe").
//
// Every answer is classified as the port says (classify.go): a card's
// refusal and a request Stripe refused are final; a network failure, a
// timeout, a 5xx, a key still in use (409), a rate limit (429) and an
// authentication failure leave the outcome unknown, for recovery to look
// again; the same key sent with other parameters is a bug of ours, logged at
// ERROR and never taken for a decline.
package stripeproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v82"

	"github.com/exactlyonce/payments/internal/processor"
)

// Config is how to reach a Stripe account.
type Config struct {
	// APIKey is the secret key (STRIPE_API_KEY). It is never logged.
	APIKey string
	// APIBase, if set, replaces https://api.stripe.com (STRIPE_API_BASE:
	// stripe-mock, a proxy).
	APIBase string
	// Account is the Stripe account's id (acct_...), which names the
	// processor in every operation sent to it (processor.Processor.Name).
	// Empty: New asks Stripe (GET /v1/account).
	Account string
	// HTTPClient makes the calls; nil: one with kept connections. The
	// caller's context bounds each call.
	HTTPClient *http.Client
	// MaxNetworkRetries is how often stripe-go sends a request again, under
	// the same key, after a network failure, a 409 or a 5xx (default 2; a
	// negative value: never).
	MaxNetworkRetries int
	Log               *slog.Logger
}

// Stripe is the adapter.
type Stripe struct {
	client  *stripe.Client
	account string
	log     *slog.Logger
}

var (
	_ processor.Processor = (*Stripe)(nil)
	_ processor.Records   = (*Stripe)(nil)
)

// New returns the adapter for cfg's account. When cfg.Account is empty it
// asks Stripe which account cfg.APIKey is (the key's own check, too); its
// error then names the setting that avoids the call.
func New(ctx context.Context, cfg Config) (*Stripe, error) {
	if cfg.APIKey == "" {
		return nil, errors.New("stripeproc: no API key")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	retries := int64(2)
	if cfg.MaxNetworkRetries != 0 {
		retries = max(int64(cfg.MaxNetworkRetries), 0)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	}
	bc := &stripe.BackendConfig{HTTPClient: hc, MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}}
	if cfg.APIBase != "" {
		bc.URL = stripe.String(strings.TrimSuffix(cfg.APIBase, "/"))
	}
	s := &Stripe{client: stripe.NewClient(cfg.APIKey, stripe.WithBackends(stripe.NewBackendsWithConfig(bc))),
		account: cfg.Account, log: cfg.Log}
	if s.account == "" {
		acct, err := s.client.V1Accounts.Retrieve(ctx, &stripe.AccountRetrieveParams{})
		if err != nil {
			return nil, fmt.Errorf("stripeproc: which Stripe account the API key is (set STRIPE_ACCOUNT to start without asking): %w", describe(err))
		}
		s.account = acct.ID
	}
	return s, nil
}

// Name is "stripe" and the account: an operation sent to one account is
// never looked up, re-driven or reversed at another.
func (s *Stripe) Name() string { return "stripe " + s.account }

// metadataReference is the PaymentIntent metadata key of our reference.
const metadataReference = "reference"

// Authorize creates and confirms a PaymentIntent under a.Key: captured at
// once, or held (capture_method manual) when !a.Capture.
func (s *Stripe) Authorize(ctx context.Context, a processor.Authorization) processor.Result {
	p := &stripe.PaymentIntentCreateParams{
		Amount:             stripe.Int64(a.Amount),
		Currency:           stripe.String(strings.ToLower(a.Currency)),
		PaymentMethod:      stripe.String(a.PaymentMethod),
		PaymentMethodTypes: []*string{stripe.String("card")},
		Confirm:            stripe.Bool(true),
	}
	if !a.Capture {
		p.CaptureMethod = stripe.String(string(stripe.PaymentIntentCaptureMethodManual))
	}
	p.AddMetadata(metadataReference, a.Reference)
	p.AddExpand("latest_charge")
	p.SetIdempotencyKey(a.Key)
	pi, err := s.client.V1PaymentIntents.Create(ctx, p)
	return s.intentResult(ctx, "create", pi, err)
}

// Capture captures amount of the authorization (0: all of it).
func (s *Stripe) Capture(ctx context.Context, key, psp string, amount int64) processor.Result {
	p := &stripe.PaymentIntentCaptureParams{}
	if amount > 0 {
		p.AmountToCapture = stripe.Int64(amount)
	}
	p.AddExpand("latest_charge")
	p.SetIdempotencyKey(key)
	pi, err := s.client.V1PaymentIntents.Capture(ctx, psp, p)
	return s.intentResult(ctx, "capture", pi, err)
}

// Void cancels an authorization nothing of which is captured.
func (s *Stripe) Void(ctx context.Context, key, psp string) processor.Result {
	p := &stripe.PaymentIntentCancelParams{}
	p.AddExpand("latest_charge")
	p.SetIdempotencyKey(key)
	pi, err := s.client.V1PaymentIntents.Cancel(ctx, psp, p)
	r := s.intentResult(ctx, "cancel", pi, err)
	if r.Outcome == processor.Declined && r.Payment.Status == statusVoided {
		// A cancellation answers with the intent cancelled: done.
		r.Outcome, r.Code = processor.Approved, ""
	}
	return r
}

// Refund refunds amount of what was captured (0: all that is left).
func (s *Stripe) Refund(ctx context.Context, key, psp string, amount int64) processor.Result {
	p := &stripe.RefundCreateParams{PaymentIntent: stripe.String(psp)}
	if amount > 0 {
		p.Amount = stripe.Int64(amount)
	}
	p.SetIdempotencyKey(key)
	rf, err := s.client.V1Refunds.Create(ctx, p)
	if err != nil {
		return s.errorResult(ctx, "refund", err)
	}
	r := processor.Result{Payment: processor.Payment{PSPReference: psp, RefundedAmount: rf.Amount}}
	switch rf.Status {
	case stripe.RefundStatusSucceeded:
		r.Outcome = processor.Approved
	case stripe.RefundStatusPending, stripe.RefundStatusRequiresAction:
		r.Outcome, r.Code = processor.Pending, string(rf.Status)
	default: // failed, canceled
		r.Outcome, r.Code = processor.Declined, "refund_"+string(rf.Status)
		if rf.FailureReason != "" {
			r.Code = string(rf.FailureReason)
		}
	}
	return r
}

// Lookup returns the PaymentIntents carrying our reference: a search, which
// may not show an intent created in the last minute or so.
func (s *Stripe) Lookup(ctx context.Context, reference string) ([]processor.Payment, error) {
	p := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{
		Query: fmt.Sprintf("metadata['%s']:'%s'", metadataReference, searchQuoted(reference)), Context: ctx}}
	p.AddExpand("data.latest_charge")
	var found []processor.Payment
	for pi, err := range s.client.V1PaymentIntents.Search(ctx, p) {
		if err != nil {
			return nil, fmt.Errorf("%w: search: %w", processor.ErrUnknown, describe(err))
		}
		found = append(found, paymentOf(pi))
	}
	return found, nil
}

// searchQuoted escapes a value for a search query's single quotes. Our
// references are letters, digits and underscores; this keeps a query whole
// whatever it is given.
func searchQuoted(v string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)
}

// Reverse gives back whatever was done under our reference: each intent
// holding an authorization is cancelled, each captured one refunded (what
// is left of it), each under a key derived from key and the intent. It is
// Approved when every intent found holds nothing any more; an intent still
// deciding (processing) cannot be reversed yet, and is refused.
func (s *Stripe) Reverse(ctx context.Context, key, reference string) processor.Result {
	found, err := s.Lookup(ctx, reference)
	if err != nil {
		return processor.Result{Outcome: processor.Unknown, Code: codeLookupFailed, Err: err}
	}
	res := processor.Result{Outcome: processor.Approved}
	for _, p := range found {
		var r processor.Result
		switch p.Status {
		case statusAuthorized, statusDeclined:
			r = s.Void(ctx, key+":"+p.PSPReference, p.PSPReference)
		case statusCaptured:
			if p.CapturedAmount-p.RefundedAmount <= 0 {
				continue
			}
			r = s.Refund(ctx, key+":"+p.PSPReference, p.PSPReference, p.CapturedAmount-p.RefundedAmount)
		case statusPending:
			r = processor.Result{Outcome: processor.Unknown, Code: "processing"}
		default: // voided
			continue
		}
		res.Payments = append(res.Payments, p)
		if r.Outcome != processor.Approved {
			return processor.Result{Outcome: processor.Declined, Code: r.Code, Payments: res.Payments, Err: r.Err}
		}
	}
	return res
}

// Payments lists the PaymentIntents created in [since, until), every page.
func (s *Stripe) Payments(ctx context.Context, since, until time.Time) ([]processor.Payment, error) {
	p := &stripe.PaymentIntentListParams{CreatedRange: &stripe.RangeQueryParams{
		GreaterThanOrEqual: since.Unix(), LesserThan: until.Unix()}}
	p.Context = ctx
	p.Limit = stripe.Int64(100)
	p.AddExpand("data.latest_charge")
	var found []processor.Payment
	for pi, err := range s.client.V1PaymentIntents.List(ctx, p) {
		if err != nil {
			return nil, fmt.Errorf("%w: list payment intents: %w", processor.ErrUnknown, describe(err))
		}
		found = append(found, paymentOf(pi))
	}
	return found, nil
}
