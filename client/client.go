package client

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Client calls the payments API. It is safe for concurrent use.
type Client struct {
	base   string // without a trailing slash
	apiKey string
	http   *http.Client
	policy RetryPolicy
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends the requests through hc (its Transport, its Timeout,
// which bounds each attempt). The default is a client with a 10 s timeout,
// a third of DefaultRetryPolicy's MaxElapsed: an attempt that hangs leaves
// room for retries.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithRetryPolicy replaces DefaultRetryPolicy.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.policy = p.withDefaults() } }

// New returns a client of the service at baseURL (such as
// "http://localhost:8080") that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:   strings.TrimRight(baseURL, "/"),
		apiKey: apiKey,
		http:   &http.Client{Timeout: 10 * time.Second},
		policy: DefaultRetryPolicy,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Version is the client's version, sent in its User-Agent.
const Version = "1.2.0"

// UserAgent is what every request of the client says it is.
const UserAgent = "payments-go/" + Version

// CallOption configures one operation.
type CallOption func(*call)

type call struct {
	key string
}

// WithIdempotencyKey sends key as the operation's Idempotency-Key instead of
// a generated one. Save a key with the operation it names before you send it,
// and pass it again to resume that operation after a crash: the service
// replays the outcome rather than executing it twice.
func WithIdempotencyKey(key string) CallOption { return func(c *call) { c.key = key } }

// Result is a decoded answer with what the caller may want to know about how
// it was obtained. On an error, the methods return a Result all the same,
// with a zero Data, so that RequestIDs can be quoted.
type Result[T any] struct {
	Data T
	// Replayed says the service answered with the stored response of an
	// earlier request with the same key (Idempotent-Replayed: true): the
	// operation executed once, before, and this is its outcome.
	Replayed bool
	// IdempotencyKey is the key sent on every attempt (POST only).
	IdempotencyKey string
	// RequestIDs are the X-Request-Id of every attempt, oldest first, the
	// unanswered ones included: the client sends its own (req_ and 24
	// hexadecimal digits), which the service logs and echoes. Quote them when
	// you report a problem.
	RequestIDs []string
	// Attempts counts the requests sent, answered or not.
	Attempts int
	// Location is the path of the object a 201 created, or of the card
	// charge (or card refund) a 202 accepted.
	Location string
	// StatusCode is the HTTP status of the answer: 202 for a card charge
	// still processing (see CreateCharge), or a card charge's capture, void
	// or refund whose outcome the processor has not given yet.
	StatusCode int
	// RetryAfter is the answer's Retry-After, zero when it had none: with a
	// 202, when to ask about the charge (the refund) again.
	RetryAfter time.Duration

	requestID *string // the caller's own X-Request-Id, if it gave one
}

// CreateAccount opens an account (POST /v1/accounts). Errors: a *Problem for
// a refusal (invalid-request, unauthorized, ...), or a *RetryError when it
// gave up retrying.
func (c *Client) CreateAccount(ctx context.Context, in NewAccount, opts ...CallOption) (*Result[Account], error) {
	return post[Account](ctx, c, "/v1/accounts", in, opts)
}

// GetAccount reads an account with its balance and available funds. Errors
// as for CreateAccount;
// an unknown account is a *Problem with Code CodeNotFound.
func (c *Client) GetAccount(ctx context.Context, id AccountID) (*Result[Account], error) {
	return get[Account](ctx, c, "/v1/accounts/"+url.PathEscape(id), nil)
}

// Deposit adds money to an account (POST /v1/accounts/{id}/deposits).
// Errors as for CreateAccount.
func (c *Client) Deposit(ctx context.Context, accountID AccountID, in NewDeposit, opts ...CallOption) (*Result[Deposit], error) {
	return post[Deposit](ctx, c, "/v1/accounts/"+url.PathEscape(accountID)+"/deposits", in, opts)
}

// GetDeposit reads one deposit of an account. Errors as for GetAccount.
func (c *Client) GetDeposit(ctx context.Context, accountID AccountID, id DepositID) (*Result[Deposit], error) {
	return get[Deposit](ctx, c, "/v1/accounts/"+url.PathEscape(accountID)+"/deposits/"+url.PathEscape(id), nil)
}

// CreateCharge charges an account (POST /v1/charges), or, with in.Capture
// false, authorizes the amount for a later Capture or Void. Available funds
// that do not cover it are a *Problem with Code CodeInsufficientFunds and the
// ChargeID of the failed charge the service recorded; other refusals are
// *Problem too, and a *RetryError says it gave up retrying.
//
// With in.PaymentMethod instead of in.AccountID, it charges a card at the
// service's card processor. The processor's answer within the service's
// wait is a charge succeeded (or authorized) or a *Problem with Code
// CodeCardDeclined (and DeclineCode). Otherwise the answer is the charge
// still processing: Result.StatusCode is 202 and Data.Status is
// ChargeStatusProcessing, and the charge goes on without you: WaitForCharge
// follows it to its outcome. A retry with the same key never charges twice.
func (c *Client) CreateCharge(ctx context.Context, in NewCharge, opts ...CallOption) (*Result[Charge], error) {
	return post[Charge](ctx, c, "/v1/charges", in, opts)
}

// GetCharge reads a charge with its amount_captured and amount_refunded; an
// authorization past its expires_at reads as expired. Errors as for
// GetAccount.
func (c *Client) GetCharge(ctx context.Context, id ChargeID) (*Result[Charge], error) {
	return get[Charge](ctx, c, "/v1/charges/"+url.PathEscape(id), nil)
}

// ListCharges reads one page of charges, newest first. Continue with
// StartingAfter set to the last charge's id while HasMore is true, or use
// Charges. Errors as for GetAccount.
func (c *Client) ListCharges(ctx context.Context, p ListChargesParams) (*Result[ChargeList], error) {
	q := url.Values{}
	setQuery(q, "account_id", p.AccountID)
	setQuery(q, "starting_after", p.StartingAfter)
	if p.Limit != nil {
		q.Set("limit", strconv.Itoa(*p.Limit))
	}
	return getAs[ChargeList](ctx, c, "/v1/charges", q, p.XRequestID)
}

// Charges iterates over every charge that ListCharges would page through
// from p, fetching the pages as it goes. It stops at the first error, which
// it yields with a zero Charge.
func (c *Client) Charges(ctx context.Context, p ListChargesParams) iter.Seq2[Charge, error] {
	return func(yield func(Charge, error) bool) {
		for {
			res, err := c.ListCharges(ctx, p)
			if err != nil {
				yield(Charge{}, err)
				return
			}
			for _, ch := range res.Data.Data {
				if !yield(ch, nil) {
					return
				}
			}
			if !res.Data.HasMore || len(res.Data.Data) == 0 {
				return
			}
			last := res.Data.Data[len(res.Data.Data)-1].ID
			p.StartingAfter = &last
		}
	}
}

// Capture takes all of an authorized charge, or in.Amount of it (POST
// /v1/charges/{id}/capture), and releases the rest of its hold; the answer
// is the charge, now succeeded. Refusals are a *Problem:
// CodeChargeNotCapturable (with ChargeStatus, such as "expired"),
// CodeCaptureExceedsAuthorization, CodeNotFound; for a card charge also
// CodeChargeOperationInProgress and CodeProcessorDeclined. A card charge's
// capture the processor has not answered yet is Result.StatusCode 202 with
// the charge as it stands (still authorized): retry with the same key, or
// read the charge after RetryAfter.
func (c *Client) Capture(ctx context.Context, chargeID ChargeID, in CaptureCharge, opts ...CallOption) (*Result[Charge], error) {
	return post[Charge](ctx, c, "/v1/charges/"+url.PathEscape(chargeID)+"/capture", in, opts)
}

// Void releases the whole hold of an authorized charge (POST
// /v1/charges/{id}/void); the answer is the charge, now voided. Refusals are
// a *Problem: CodeChargeNotVoidable (with ChargeStatus), CodeNotFound; for a
// card charge also CodeChargeOperationInProgress and CodeProcessorDeclined,
// and a 202 as for Capture.
func (c *Client) Void(ctx context.Context, chargeID ChargeID, opts ...CallOption) (*Result[Charge], error) {
	return post[Charge](ctx, c, "/v1/charges/"+url.PathEscape(chargeID)+"/void", VoidCharge{}, opts)
}

// CreateRefund gives back all of a charge's captured amount, or in.Amount of
// it (POST /v1/charges/{id}/refunds). Refusals are a *Problem:
// CodeRefundExceedsCharge, CodeChargeNotRefundable (the charge is not
// succeeded), CodeNotFound; for a card charge also CodeProcessorDeclined.
// A card charge's refund the processor has not answered yet is
// Result.StatusCode 202 with the refund pending (its amount reserved).
func (c *Client) CreateRefund(ctx context.Context, chargeID ChargeID, in NewRefund, opts ...CallOption) (*Result[Refund], error) {
	return post[Refund](ctx, c, "/v1/charges/"+url.PathEscape(chargeID)+"/refunds", in, opts)
}

// GetRefund reads one refund of a charge. Errors as for GetAccount.
func (c *Client) GetRefund(ctx context.Context, chargeID ChargeID, id RefundID) (*Result[Refund], error) {
	return get[Refund](ctx, c, "/v1/charges/"+url.PathEscape(chargeID)+"/refunds/"+url.PathEscape(id), nil)
}

func setQuery(q url.Values, name string, v *string) {
	if v != nil {
		q.Set(name, *v)
	}
}

func post[T any](ctx context.Context, c *Client, path string, in any, opts []CallOption) (*Result[T], error) {
	var cl call
	for _, o := range opts {
		o(&cl)
	}
	if cl.key == "" {
		k, err := uuid.NewV7()
		if err != nil {
			return &Result[T]{}, fmt.Errorf("payments: idempotency key: %w", err)
		}
		cl.key = k.String()
	}
	// Marshalled once: every attempt sends these very bytes, so the service
	// sees one fingerprint however often it is retried.
	body, err := json.Marshal(in)
	if err != nil {
		return &Result[T]{IdempotencyKey: cl.key}, fmt.Errorf("payments: encode request: %w", err)
	}
	res := &Result[T]{IdempotencyKey: cl.key}
	return res, do(ctx, c, http.MethodPost, path, cl.key, body, res)
}

func get[T any](ctx context.Context, c *Client, path string, q url.Values) (*Result[T], error) {
	return getAs[T](ctx, c, path, q, nil)
}

// getAs is get with the caller's own X-Request-Id, when it gives one, sent
// on every attempt instead of a generated one.
func getAs[T any](ctx context.Context, c *Client, path string, q url.Values, requestID *string) (*Result[T], error) {
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	res := &Result[T]{requestID: requestID}
	return res, do(ctx, c, http.MethodGet, path, "", nil, res)
}

// outcome is what one attempt got.
type outcome struct {
	status     int
	header     http.Header
	body       []byte
	retryAfter time.Duration
	err        error // a transport error, or the *Problem of an error status
	transport  bool  // err is a transport error: no answer came
}

// do runs one operation: attempts, with backoff, until an answer that is not
// to be retried, then decodes it into res.
func do[T any](ctx context.Context, c *Client, method, path, key string, body []byte, res *Result[T]) error {
	p := c.policy
	start := time.Now()
	var prev error // the previous attempt's outcome
	for {
		rid := newRequestID()
		if res.requestID != nil && *res.requestID != "" {
			rid = *res.requestID
		}
		o := c.attempt(ctx, method, path, key, rid, body)
		res.Attempts++
		if id := o.header.Get("X-Request-Id"); id != "" {
			rid = id // what the service logged, should something between have changed it
		}
		res.RequestIDs = append(res.RequestIDs, rid)
		if o.transport && ctx.Err() != nil {
			// The context cut this attempt short: the last outcome worth
			// reporting is the previous attempt's, if there was one.
			last := o.err
			if prev != nil {
				last = prev
			}
			return &RetryError{Attempts: res.Attempts, RequestIDs: res.RequestIDs, Last: last, Cause: ctx.Err()}
		}
		prev = o.err
		if o.err == nil {
			res.Replayed = o.header.Get("Idempotent-Replayed") == "true"
			res.Location = o.header.Get("Location")
			res.StatusCode, res.RetryAfter = o.status, o.retryAfter
			if err := json.Unmarshal(o.body, &res.Data); err != nil {
				return fmt.Errorf("payments: decode %d response to %s %s: %w", o.status, method, path, err)
			}
			return nil
		}
		var prob *Problem
		if errors.As(o.err, &prob) && !retryable(prob.Status, prob.Code) {
			res.Replayed = prob.Replayed
			return prob
		}
		if res.Attempts >= p.MaxAttempts {
			return &RetryError{Attempts: res.Attempts, RequestIDs: res.RequestIDs, Last: o.err}
		}
		wait := p.backoff(res.Attempts, o.retryAfter)
		next := time.Now().Add(wait)
		if next.After(start.Add(p.MaxElapsed)) {
			return &RetryError{Attempts: res.Attempts, RequestIDs: res.RequestIDs, Last: o.err,
				Cause: fmt.Errorf("next attempt in %v would pass the %v budget", wait, p.MaxElapsed)}
		}
		if d, ok := ctx.Deadline(); ok && next.After(d) {
			// Waiting would only end in the deadline: report now, with the
			// outcome in hand.
			return &RetryError{Attempts: res.Attempts, RequestIDs: res.RequestIDs, Last: o.err, Cause: context.DeadlineExceeded}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &RetryError{Attempts: res.Attempts, RequestIDs: res.RequestIDs, Last: o.err, Cause: ctx.Err()}
		case <-t.C:
		}
	}
}

// attempt sends one request and reads its answer whole.
func (c *Client) attempt(ctx context.Context, method, path, key, requestID string, body []byte) outcome {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return outcome{err: fmt.Errorf("payments: %s %s: %w", method, path, err), header: http.Header{}}
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set("X-Request-Id", requestID)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return outcome{err: fmt.Errorf("payments: %s %s: %w", method, path, err), transport: true, header: http.Header{}}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		// The answer was lost half way: as uncertain as no answer at all.
		return outcome{err: fmt.Errorf("payments: %s %s: read response: %w", method, path, err), transport: true, header: resp.Header}
	}
	o := outcome{status: resp.StatusCode, header: resp.Header, body: data,
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return o
	}
	prob := &Problem{}
	if json.Unmarshal(data, prob) != nil || prob.Status == 0 {
		// Not problem+json (a proxy's error page, say): keep the status.
		prob = &Problem{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode), Detail: snippet(data)}
	}
	prob.Status = resp.StatusCode
	prob.RetryAfter = o.retryAfter
	prob.RequestID = resp.Header.Get("X-Request-Id")
	prob.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	o.err = prob
	return o
}

func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// newRequestID returns an X-Request-Id in the service's own format, so that
// even an attempt whose answer was lost can be found in the service's logs.
func newRequestID() string {
	u := uuid.New() // random (version 4)
	return "req_" + hex.EncodeToString(u[:12])
}
