package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/exactlyonce/payments/internal/docs"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

// problemType is one kind of RFC 9457 problem this API answers with.
type problemType struct {
	slug   string
	status int
	title  string
	about  string // served at /problems/{slug}
}

// The problem types of the API. Their slugs are part of the contract.
var (
	probKeyMissing = problemType{"idempotency-key-missing", http.StatusBadRequest, "Idempotency-Key header missing",
		"Every POST under /v1 needs an Idempotency-Key header so it can be retried safely. Send a fresh UUID per operation and reuse it for that operation's retries."}
	probKeyInvalid = problemType{"idempotency-key-invalid", http.StatusBadRequest, "Idempotency-Key header invalid",
		"An Idempotency-Key is 1 to 255 visible ASCII characters (0x21-0x7E), sent once, bare (abc) or as a Structured Field string (\"abc\", RFC 8941) that holds such a key. The detail says what is wrong."}
	probInvalidRequest = problemType{"invalid-request", http.StatusBadRequest, "Invalid request",
		"The request body or parameters break the API's rules: malformed JSON, an unknown field, a wrong type, or a value out of range. The detail names the problem; nothing was stored or changed."}
	probUnauthorized = problemType{"unauthorized", http.StatusUnauthorized, "Unauthorized",
		"Send your API key as Authorization: Bearer <api key>."}
	probInsufficientFunds = problemType{"insufficient-funds", http.StatusPaymentRequired, "Insufficient funds",
		"The account's balance does not cover the charge. The failed charge is recorded (charge_id) and this answer is replayed for retries of the same request."}
	probNotFound = problemType{"not-found", http.StatusNotFound, "Not found",
		"No such object exists for your merchant."}
	probAccountNotFound = problemType{"account-not-found", http.StatusNotFound, "Account not found",
		"The charge names an account your merchant does not have."}
	probMethodNotAllowed = problemType{"method-not-allowed", http.StatusMethodNotAllowed, "Method not allowed",
		"This path does not support the request method."}
	probTooManyUnknownKeys = problemType{"too-many-unknown-keys", http.StatusTooManyRequests, "Too many unknown API keys",
		"Your address sent more API keys that turned out unknown than the service looks up for it (or the lookups of keys the service has not seen were all busy), and your key, which the service has not seen yet, could not be looked up within the wait bound. It was not checked: this says nothing about it. Retry after the Retry-After delay; keys the service has already found valid are not limited."}
	probRateLimited = problemType{"rate-limited", http.StatusTooManyRequests, "Rate limited",
		"Your merchant sent more requests of this kind than this replica serves it a second (reads, GET, and writes, every other method, have budgets of their own; the detail says which and how many). The request was not looked at: nothing was claimed or changed, and its Idempotency-Key is not used. Retry after the Retry-After delay, with the same key."}
	probKeyInUse = problemType{"idempotency-key-in-use", http.StatusConflict, "Idempotency-Key in use",
		"Another request with this Idempotency-Key is still being processed. Retry after the Retry-After delay; you will receive its outcome."}
	probTooLarge = problemType{"request-too-large", http.StatusRequestEntityTooLarge, "Request body too large",
		"Request bodies are limited to 64 KiB."}
	probUnsupportedMedia = problemType{"unsupported-media-type", http.StatusUnsupportedMediaType, "Unsupported media type",
		"Send request bodies as Content-Type: application/json (UTF-8)."}
	probKeyReused = problemType{"idempotency-key-reused", http.StatusUnprocessableEntity, "Idempotency-Key reused",
		"This Idempotency-Key was already used for a different request (method, path or body differ). Nothing was executed; use a new key for a new operation."}
	probCurrencyMismatch = problemType{"currency-mismatch", http.StatusUnprocessableEntity, "Currency mismatch",
		"The charge's currency differs from the account's currency."}
	probRefundExceeds = problemType{"refund-exceeds-charge", http.StatusUnprocessableEntity, "Refund exceeds charge",
		"The refunds of a charge cannot add up to more than was charged; nothing is left to refund, or the amount asked is more than what is left."}
	probNotRefundable = problemType{"charge-not-refundable", http.StatusConflict, "Charge not refundable",
		"Only a succeeded (captured) charge can be refunded; this one failed, or is an authorization that was not captured, and moved no money."}
	probNotCapturable = problemType{"charge-not-capturable", http.StatusConflict, "Charge not capturable",
		"Only an authorized charge (created with capture: false, neither captured, voided nor expired) can be captured. charge_status says what the charge is now."}
	probNotVoidable = problemType{"charge-not-voidable", http.StatusConflict, "Charge not voidable",
		"Only an authorized charge (created with capture: false, neither captured, voided nor expired) can be voided. charge_status says what the charge is now."}
	probCaptureExceeds = problemType{"capture-exceeds-authorization", http.StatusUnprocessableEntity, "Capture exceeds authorization",
		"A capture can take at most the authorized amount; nothing was captured."}
	probTooManyWebhookEndpoints = problemType{"too-many-webhook-endpoints", http.StatusConflict, "Too many webhook endpoints",
		"A merchant has at most 16 webhook endpoints. Delete one (DELETE /v1/webhook_endpoints/{id}) before creating another. This answer is stored: a retry with the same Idempotency-Key replays it; use a new key once there is room."}
	probInternal = problemType{"internal-error", http.StatusInternalServerError, "Internal error",
		"Something failed inside the service. Nothing was changed; retrying with the same Idempotency-Key is safe."}
	probUnavailable = problemType{"service-unavailable", http.StatusServiceUnavailable, "Service unavailable",
		"The database cannot be reached right now. Nothing was changed, or the change completed and a retry with the same Idempotency-Key returns it; retry after the Retry-After delay."}
	probCardDeclined = problemType{"card-declined", http.StatusPaymentRequired, "Card declined",
		"The card processor declined the charge; decline_code is its reason (insufficient_funds, do_not_honor, ...). The failed charge is recorded (charge_id) and this answer is replayed for retries of the same request."}
	probCardChargeFailed = problemType{"card-charge-failed", http.StatusPaymentRequired, "Card charge failed",
		"The charge failed at the card processor without a decline: past the processor's decision deadline it had no record of it, or it cancelled it itself, or an operator settled it as failed after a review of the processor's records (the charge's failure_code says which). No money moved. The failed charge is recorded (charge_id) and this answer is replayed for retries of the same request."}
	probChargeReversed = problemType{"charge-reversed", http.StatusPaymentRequired, "Charge reversed",
		"The card processor's outcome stayed unknown past its decision deadline, so the charge was reversed there: whatever it did was cancelled or refunded, and no money moved. The charge is recorded (charge_id, status reversed) and this answer is replayed for retries of the same request."}
	probNoProcessor = problemType{"no-card-processor", http.StatusBadRequest, "No card processor",
		"This deployment charges no cards: it has no card processor (its operator's PROCESSOR setting is none), so charges by payment_method, their captures, voids and refunds, and processors' webhooks are refused. Nothing was written. Charges by account_id work."}
	probProcessorNotConfigured = problemType{"processor-not-configured", http.StatusServiceUnavailable, "Processor not configured",
		"The card charge was authorized at a processor this deployment is not configured for (its PROCESSOR changed while the charge's operations were open), and its captures, voids and refunds go only to that one. Nothing was written; a retry with the same Idempotency-Key is safe once a replica configured for that processor serves it."}
	probOperationInProgress = problemType{"charge-operation-in-progress", http.StatusConflict, "Charge operation in progress",
		"A capture or void of this card charge is in flight at the card processor (or awaiting an operator's review); its outcome decides what the charge is, and the charge keeps its status until then (charge_status). Read the charge again later. This answer is stored: a retry with the same Idempotency-Key replays it; send a new key to try again."}
	probProcessorDeclined = problemType{"processor-declined", http.StatusConflict, "Declined by the card processor",
		"The card processor refused this capture, void or refund of a card charge; decline_code is its reason (invalid_state: the payment at the processor does not allow it). Nothing moved: the charge is as it was, and a refund is failed. This answer is replayed for retries of the same request."}
	probShuttingDown = problemType{"shutting-down", http.StatusServiceUnavailable, "Shutting down",
		"This replica has been asked to stop (SIGTERM). It still serves every request it is sent until its load balancer has moved traffic away (SHUTDOWN_DELAY), then finishes those in flight and stops; only its readiness (/readyz) says so."}
)

var problemCatalogue = []problemType{
	probKeyMissing, probKeyInvalid, probInvalidRequest, probUnauthorized, probInsufficientFunds,
	probNotFound, probAccountNotFound, probMethodNotAllowed, probTooManyUnknownKeys, probRateLimited, probKeyInUse, probTooLarge,
	probUnsupportedMedia, probKeyReused, probCurrencyMismatch, probRefundExceeds, probNotRefundable,
	probNotCapturable, probNotVoidable, probCaptureExceeds, probTooManyWebhookEndpoints, probInternal, probUnavailable, probShuttingDown,
	probCardDeclined, probCardChargeFailed, probChargeReversed, probNoProcessor, probProcessorNotConfigured,
	probOperationInProgress, probProcessorDeclined,
}

// errorProblems maps domain errors to problem types: the one table that turns
// errors into statuses.
var errorProblems = []struct {
	err  error
	prob problemType
}{
	{idempotency.ErrKeyMissing, probKeyMissing},
	{idempotency.ErrKeyInvalid, probKeyInvalid},
	{idempotency.ErrKeyReused, probKeyReused},
	{idempotency.ErrKeyInUse, probKeyInUse},
	{payment.ErrUnauthenticated, probUnauthorized},
	{payment.ErrTooManyUnknownKeys, probTooManyUnknownKeys},
	{payment.ErrRateLimited, probRateLimited},
	{payment.ErrNotFound, probNotFound},
	{payment.ErrAccountNotFound, probAccountNotFound},
	{payment.ErrCurrencyMismatch, probCurrencyMismatch},
	{payment.ErrRefundExceedsCharge, probRefundExceeds},
	{payment.ErrChargeNotRefundable, probNotRefundable},
	{payment.ErrChargeNotCapturable, probNotCapturable},
	{payment.ErrChargeNotVoidable, probNotVoidable},
	{payment.ErrCaptureExceedsAuthorization, probCaptureExceeds},
	{payment.ErrTooManyWebhookEndpoints, probTooManyWebhookEndpoints},
	{payment.ErrCardDeclined, probCardDeclined},
	{payment.ErrCardChargeFailed, probCardChargeFailed},
	{payment.ErrChargeReversed, probChargeReversed},
	{payment.ErrNoProcessor, probNoProcessor},
	{payment.ErrProcessorNotConfigured, probProcessorNotConfigured},
	{payment.ErrOperationInProgress, probOperationInProgress},
	{payment.ErrProcessorDeclined, probProcessorDeclined},
	// Before ErrUnavailable: /readyz wraps its cause in ErrUnavailable too.
	{payment.ErrShuttingDown, probShuttingDown},
	{payment.ErrUnavailable, probUnavailable},
	// The request's client left, or its time ran out, before the outcome was
	// known: whatever committed, a retry with the key answers it.
	{context.Canceled, probUnavailable},
	{context.DeadlineExceeded, probUnavailable},
	{payment.ErrInsufficientFunds, probInsufficientFunds},
	{errInvalidBody, probInvalidRequest},
	{errTooLarge, probTooLarge},
	{errMediaType, probUnsupportedMedia},
	{docs.ErrNoSuchFile, probNotFound},
	{docs.ErrMethod, probMethodNotAllowed},
	{errMethodNotAllowed, probMethodNotAllowed},
}

// errMethodNotAllowed: the path exists, not with this method.
var errMethodNotAllowed = errors.New("method not allowed")

// refused is an error with a detail of its own that is one of the table's
// errors (kind), for refusals the router decides.
type refused struct {
	detail string
	kind   error
}

func (e refused) Error() string        { return e.detail }
func (e refused) Is(target error) bool { return target == e.kind }

// problemFor returns the problem type for err, and false for an unexpected error.
func problemFor(err error) (problemType, bool) {
	var ve *payment.ValidationError
	if errors.As(err, &ve) {
		return probInvalidRequest, true
	}
	for _, e := range errorProblems {
		if errors.Is(err, e.err) {
			return e.prob, true
		}
	}
	return problemType{}, false
}

// problem is the RFC 9457 body, with this API's extension members.
type problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail"`
	Code     string `json:"code"`
	Field    string `json:"field,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
	// ChargeStatus is what a charge that cannot be captured or voided is.
	ChargeStatus string `json:"charge_status,omitempty"`
	// DeclineCode is the card processor's reason for a declined card.
	DeclineCode string `json:"decline_code,omitempty"`
}

func newProblem(p problemType, detail string) problem {
	return problem{Type: "/problems/" + p.slug, Title: p.title, Status: p.status, Detail: detail, Code: p.slug}
}

// problemFromError builds the problem for a known error, naming the invalid
// field, or the failed charge of a 402.
func problemFromError(p problemType, err error) problem {
	pr := newProblem(p, err.Error())
	var (
		ve *payment.ValidationError
		be *bodyError
		fc *payment.FailedCharge
		se *payment.ChargeStateError
		cf *payment.CardChargeFailure
		ip *payment.OperationInProgress
		od *payment.OperationDeclined
	)
	switch {
	case errors.As(err, &ve):
		pr.Field = ve.Field
	case errors.As(err, &be):
		pr.Field = be.field
	case errors.As(err, &fc):
		pr.ChargeID = payment.FormatID(payment.PrefixCharge, fc.Charge.ID)
	case errors.As(err, &se):
		pr.ChargeStatus = string(se.Charge.Status)
	case errors.As(err, &cf):
		pr.ChargeID, pr.DeclineCode = payment.FormatID(payment.PrefixCharge, cf.Charge.ID), cf.Charge.DeclineCode
	case errors.As(err, &ip):
		pr.ChargeStatus = string(ip.Charge.Status)
	case errors.As(err, &od):
		pr.ChargeID, pr.DeclineCode = payment.FormatID(payment.PrefixCharge, od.Charge.ID), od.Code
	}
	return pr
}

func (p problem) response() response {
	r, _ := jsonResponse(p.Status, "", p) // plain strings and ints: cannot fail
	return r
}
