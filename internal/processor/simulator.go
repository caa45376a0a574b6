package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"
)

// Simulator is the Processor of the card processor simulator (cmd/procsim),
// over HTTP.
type Simulator struct {
	base   string
	client *http.Client
	// Attempts bounds the tries of a request that failed before it was
	// written (refused, DNS), each with the same key; Backoff is the wait
	// before the second, doubled for each next.
	Attempts int
	Backoff  time.Duration
}

// NewSimulator returns the adapter for the simulator at baseURL
// ("http://host:port"), calling through client; its Timeout, or the caller's
// context, bounds each call.
func NewSimulator(baseURL string, client *http.Client) *Simulator {
	return &Simulator{base: baseURL, client: client, Attempts: 5, Backoff: 100 * time.Millisecond}
}

var _ Processor = (*Simulator)(nil)

// Name is "simulator" and the simulator's address: each simulator keeps its
// own payments.
func (s *Simulator) Name() string { return "simulator " + s.base }

// Authorize asks for an authorization, captured now if a.Capture.
func (s *Simulator) Authorize(ctx context.Context, a Authorization) Result {
	body := map[string]any{"amount": a.Amount, "currency": a.Currency, "payment_method": a.PaymentMethod,
		"reference": a.Reference, "capture": a.Capture}
	return s.write(ctx, "/v1/authorizations", a.Key, body)
}

// Capture captures amount of the authorization (0: what is left).
func (s *Simulator) Capture(ctx context.Context, key, psp string, amount int64) Result {
	return s.write(ctx, "/v1/payments/"+url.PathEscape(psp)+"/captures", key, amountBody(amount))
}

// Void cancels an authorization nothing of which is captured.
func (s *Simulator) Void(ctx context.Context, key, psp string) Result {
	return s.write(ctx, "/v1/payments/"+url.PathEscape(psp)+"/voids", key, map[string]any{})
}

// Refund refunds amount of what was captured (0: all that is left).
func (s *Simulator) Refund(ctx context.Context, key, psp string, amount int64) Result {
	return s.write(ctx, "/v1/payments/"+url.PathEscape(psp)+"/refunds", key, amountBody(amount))
}

// Reverse is the technical cancel by our reference.
func (s *Simulator) Reverse(ctx context.Context, key, reference string) Result {
	return s.write(ctx, "/v1/reversals", key, map[string]any{"reference": reference})
}

// Lookup returns the payments carrying our reference, oldest first.
func (s *Simulator) Lookup(ctx context.Context, reference string) ([]Payment, error) {
	var found struct {
		Payments []Payment `json:"payments"`
	}
	err := s.read(ctx, "lookup", "/v1/payments?reference="+url.QueryEscape(reference), &found)
	return found.Payments, err
}

// read GETs path and decodes its 200 answer into dst; any other outcome is
// an error wrapping ErrUnknown, naming what.
func (s *Simulator) read(ctx context.Context, what, path string, dst any) error {
	status, body, err := s.call(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrUnknown, what, err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("%w: %s answered %d", ErrUnknown, what, status)
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrUnknown, what, err)
	}
	return nil
}

func amountBody(amount int64) map[string]any {
	if amount == 0 {
		return map[string]any{}
	}
	return map[string]any{"amount": amount}
}

// write sends a keyed POST and classifies its answer.
func (s *Simulator) write(ctx context.Context, path, key string, v any) Result {
	body, err := json.Marshal(v)
	if err != nil {
		return Result{Outcome: Declined, Code: "invalid_request", Err: err}
	}
	status, resp, err := s.call(ctx, http.MethodPost, path, key, body)
	if err != nil {
		return Result{Outcome: Unknown, Code: unknownCode(err), Err: err}
	}
	return classify(status, resp)
}

// errNotSent is a request that failed before any of it was written.
var errNotSent = errors.New("request not sent")

// call does one request, again (same key, same body) while it fails before
// being written; a failure after it was written is returned as it is.
func (s *Simulator) call(ctx context.Context, method, path, key string, body []byte) (int, []byte, error) {
	wait := s.Backoff
	for attempt := 1; ; attempt++ {
		status, resp, err := s.once(ctx, method, path, key, body)
		if !errors.Is(err, errNotSent) || attempt >= s.Attempts {
			return status, resp, err
		}
		select {
		case <-ctx.Done():
			return 0, nil, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (s *Simulator) once(ctx context.Context, method, path, key string, body []byte) (int, []byte, error) {
	// The transport's writer goroutine reports the write.
	var written atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { written.Store(true) }}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, s.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		if !written.Load() {
			return 0, nil, fmt.Errorf("%w: %w", errNotSent, err)
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

func unknownCode(err error) string {
	var ne interface{ Timeout() bool }
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, errNotSent):
		return "not_sent"
	}
	return "connection"
}

// classify turns an answer into a Result: 200 and 202 by the body's result,
// 402 and the other 4xx refusals final, 409, 429 and 5xx unknown.
func classify(status int, body []byte) Result {
	var ans struct {
		Result   string    `json:"result"`
		Payments []Payment `json:"payments"`
		Error    struct {
			Code string `json:"code"`
		} `json:"error"`
		Payment
	}
	if err := json.Unmarshal(body, &ans); err != nil && status < 500 {
		return Result{Outcome: Unknown, Code: "unreadable_answer", Err: err}
	}
	switch {
	case status == http.StatusOK:
		r := Result{Outcome: Approved, Payment: ans.Payment, Payments: ans.Payments}
		if ans.Result == "declined" {
			r.Outcome, r.Code = Declined, ans.DeclineCode
		}
		return r
	case status == http.StatusAccepted:
		return Result{Outcome: Pending, Payment: ans.Payment}
	case status == http.StatusPaymentRequired:
		return Result{Outcome: Declined, Code: ans.DeclineCode, Payment: ans.Payment}
	case status == http.StatusConflict, status == http.StatusTooManyRequests, status >= 500:
		code := ans.Error.Code
		if code == "" {
			code = "status_" + strconv.Itoa(status)
		}
		return Result{Outcome: Unknown, Code: code}
	case status >= 400:
		return Result{Outcome: Declined, Code: ans.Error.Code}
	}
	return Result{Outcome: Unknown, Code: "status_" + strconv.Itoa(status)}
}

var _ Records = (*Simulator)(nil)

// Payments lists the payments the simulator created in [since, until),
// oldest first, a page (GET /v1/payments?created_gte=...) at a time. The
// listing is a report: it changes nothing at the simulator. An error wraps
// ErrUnknown when a page was not answered.
func (s *Simulator) Payments(ctx context.Context, since, until time.Time) ([]Payment, error) {
	var out []Payment
	after := ""
	for {
		q := url.Values{"created_gte": {since.UTC().Format(time.RFC3339Nano)}, "created_lt": {until.UTC().Format(time.RFC3339Nano)},
			"limit": {"100"}}
		if after != "" {
			q.Set("starting_after", after)
		}
		var page struct {
			Data []struct {
				Payment
				CreatedAt time.Time `json:"created_at"`
			} `json:"data"`
			HasMore bool `json:"has_more"`
		}
		if err := s.read(ctx, "list payments", "/v1/payments?"+q.Encode(), &page); err != nil {
			return nil, err
		}
		for _, p := range page.Data {
			p.Created = p.CreatedAt
			out = append(out, p.Payment)
		}
		if !page.HasMore || len(page.Data) == 0 {
			return out, nil
		}
		after = page.Data[len(page.Data)-1].PSPReference
	}
}
