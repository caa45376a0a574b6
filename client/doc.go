// Package client is the Go client of the payments API. It makes retries safe
// by default: an operation may be retried through timeouts, dropped
// connections and server failures, and the money moves once.
//
// # Getting started
//
//	c := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))
//	res, err := c.CreateCharge(ctx, client.NewCharge{
//		AccountID: "acct_4a5f3df99a5d518c03adf918c80d03ef",
//		Amount:    500, // minor units: 5.00 USD
//		Currency:  "USD",
//	})
//	if err != nil {
//		return err
//	}
//	fmt.Println(res.Data.ID, res.Data.Status, res.RequestIDs)
//
// Every method takes a context.Context and returns a *Result whose Data is
// the decoded answer: CreateAccount, GetAccount, Deposit, GetDeposit,
// CreateCharge, GetCharge, ListCharges (and Charges, which pages for you),
// Capture, Void, CreateRefund, GetRefund, ListEvents (and Events, which
// pages for you), GetEvent, and for webhook endpoints CreateWebhookEndpoint,
// ListWebhookEndpoints, GetWebhookEndpoint, UpdateWebhookEndpoint,
// DeleteWebhookEndpoint, ListWebhookAttempts (and WebhookAttempts, which pages
// for you) and ResendWebhookEvent. The request and response types (NewCharge,
// Charge, ...) are generated from the service's openapi.yaml, so their fields
// are the API's.
//
// # Authorize now, capture later
//
// CreateCharge with NewCharge.Capture set to false authorizes the amount: the
// charge is ChargeStatusAuthorized, the account's Available drops by the
// amount and its Balance does not move. Capture then takes all of it, or
// CaptureCharge.Amount of it (ChargeStatusSucceeded, AmountCaptured), and Void
// releases it (ChargeStatusVoided). Past its ExpiresAt an authorization reads
// as ChargeStatusExpired at once. Capture and Void are POSTs like the others:
// one key per call, reused on every retry, so a capture retried after a lost
// answer takes the money once. A charge that is no longer authorized is
// refused with CodeChargeNotCapturable or CodeChargeNotVoidable, and
// Problem.ChargeStatus says what it is instead.
//
// # One operation, one key
//
// The service executes a POST at most once per Idempotency-Key and answers a
// retry with the stored response. So each call of a POST method is one
// operation: the client generates one key for it (a UUIDv7), marshals the
// body once, and sends that key and those bytes on every attempt. Never reuse
// a key for another operation: the service refuses it (idempotency-key-reused).
//
// To survive a crash of your own process, choose the key yourself, save it
// with the operation before sending, and pass it again when you resume:
//
//	res, err := c.CreateCharge(ctx, in, client.WithIdempotencyKey(order.ChargeKey))
//
// If the operation had completed, the answer is its stored outcome and
// Result.Replayed is true (the service sent Idempotent-Replayed: true).
// Keys are kept 24 hours by default; resume within that window.
//
// # Retry policy
//
// An attempt is retried, with the same key and body, when it got no answer
// (a transport error or a timeout: the request may or may not have executed,
// and the key makes resending safe), or an answer that says nothing was
// done: 409 idempotency-key-in-use (the first request is still running), 429,
// or any 5xx (the service stores nothing on a 5xx). Every other 4xx is
// final and returned at once: retrying it would get the same answer.
//
// Before attempt n+1 the client waits a random time between zero and
// BaseDelay·2^(n-1), capped at MaxDelay ("full jitter", so clients that
// failed together do not come back together), and never less than the
// answer's Retry-After. It gives up after MaxAttempts attempts, or when the
// next attempt could not start within MaxElapsed of the first, or when the
// context ends; see DefaultRetryPolicy and WithRetryPolicy. GET requests are
// retried the same way. Give each attempt a time limit with WithHTTPClient
// (an http.Client's Timeout), and the whole operation one with the context.
//
// # Errors
//
// A refusal of the service is a *Problem, the RFC 9457 problem+json body
// with the Retry-After and the X-Request-Id of its answer. Switch on its
// Code (or Status), never on Detail:
//
//	var p *client.Problem
//	switch {
//	case errors.As(err, &p) && p.Code == client.CodeInsufficientFunds:
//		// the balance did not cover it; p.ChargeID is the failed charge
//	case errors.Is(err, client.ErrGaveUp):
//		// still uncertain: retry later with the same key (res.IdempotencyKey)
//	}
//
// When the client gives up retrying, the error is a *RetryError: it wraps
// ErrGaveUp, the reason (context.DeadlineExceeded when the context's deadline
// stopped it) and the last attempt's outcome, so errors.As finds the last
// *Problem too. Give-ups are the uncertain case: a transport error means the
// charge may have happened. Resolve it by retrying with the same key, which
// returns the outcome without executing twice.
//
// Result.RequestIDs holds the X-Request-Id of every attempt, answered or
// not: the client sends one of its own on each, which the service echoes and
// logs, so even the request whose answer was lost can be found. Quote them
// when you report a problem. On an error the methods still return the
// Result, with a zero Data.
//
// # Webhooks
//
// A receiver of the service's webhooks checks each delivery with
// ParseWebhook before trusting it: the body exactly as received, the
// Payments-Signature header (WebhookSignatureHeader) and the endpoint's
// secret. It checks the HMAC-SHA256 signature in constant time and that the
// signature's timestamp is within the tolerance of now (5 minutes by
// default), so a captured delivery cannot be replayed later, and returns the
// Event the body carries. A delivery may arrive more than once: deduplicate
// on that Event's ID, which the signature covers. Never deduplicate on the
// Payments-Event-Id header (WebhookEventIDHeader): the signature does not
// cover it, so a delivery captured and replayed within the tolerance with
// another value there verifies, and would be handled twice. VerifyWebhook
// checks a delivery without decoding it. See the example of ParseWebhook.
//
// SignWebhook signs a payload as the service does, for a receiver's own
// tests: hand the body and its header to your handler.
//
// # Why the types are generated by oapi-codegen
//
// oapi-codegen (with -generate models; see oapi-codegen.yaml) writes only
// the types, which this thin hand-written layer wraps with the idempotency
// and retry rules that are the point of the package. ogen generates a whole
// client instead, with its own transport that does not retry and a large
// runtime, which this layer would have to work around. `make generate`
// rewrites types.gen.go from openapi.yaml, and CI fails when it is stale.
//
// The generated names spell initialisms as Go does (ID, URL: oapi-codegen's
// name-normalizer ToCamelCaseWithInitialisms); the id types' spellings before
// 1.2.0 (ChargeId, EventId, ...) are deprecated aliases (compat.go).
//
// Some constructs of the spec come out awkwardly, and are left as generated:
// the nullable enum of Charge.failure_code adds a constant
// ChargeFailureCodeLessThannil ("<nil>") that the service never sends (a null
// is a nil *ChargeFailureCode); the allOf of ChargeFailedProblem types
// its const code and status as interface{} (use *Problem instead). The
// generated problem body is named ProblemBody by overlay.yaml, so that
// Problem is the error type. Event.Data, a oneOf with a discriminator, is
// EventData (event.go, hand-written, named by overlay.yaml): the union
// oapi-codegen writes for it would need github.com/oapi-codegen/runtime, whose
// go line is 1.26, for constructors a client never calls.
//
// Charge.FailureCode is ChargeFailureCodeInsufficientFunds
// ("insufficient-funds", the code of the 402 problem too) or, in the data of
// events written by earlier versions of the service, its former spelling
// ChargeFailureCodeInsufficientFundsFormer ("insufficient_funds", named by
// overlay.yaml): read both as the same refusal.
//
// Events are never rewritten, so the Data of events written before
// authorizations existed lacks amount_captured, expires_at and available: a
// Charge decoded from one has AmountCaptured 0 and ExpiresAt nil (read its
// AmountCaptured as Amount if it succeeded), an Account has Available 0
// (read it as Balance). VoidCharge and ResendWebhookEvent, objects with no
// fields, are struct{} (overlay.yaml).
//
// # The module
//
// The client is its own module, github.com/exactlyonce/payments/client, so
// that a program importing it gets none of the server's dependencies: it
// requires github.com/google/uuid and the standard library only. Its go line,
// 1.23, is the oldest Go that builds it (iter.Seq2 came in 1.23; built and
// tested with go1.23.0 and go1.26; go1.22 does not build it). The tests that
// need the service are in the server's module (internal/clienttest).
//
// Layout: client.go (the methods and the retry loop), endpoints.go (the
// webhook endpoints' methods), retry.go (backoff and what is retryable),
// errors.go (Problem), event.go (the event feed's methods and EventData),
// compat.go (the id types' former names), webhook.go (ParseWebhook,
// VerifyWebhook and SignWebhook, with the standard library's crypto/hmac: a
// receiver of webhooks needs nothing but this module), types.gen.go
// (generated).
package client

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml -o types.gen.go ../openapi.yaml
