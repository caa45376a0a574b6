package procsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// result is what an operation decided: the answer, whether the key keeps it,
// and the fault to play after the commit.
type result struct {
	answer
	keep  bool
	fault Fault
}

// op is one operation, run in the transaction that claimed its key.
type op func(ctx context.Context, tx pgx.Tx, now time.Time) (result, error)

// AuthorizeRequest is the body of POST /v1/authorizations.
type AuthorizeRequest struct {
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	PaymentMethod string `json:"payment_method"`
	Reference     string `json:"reference"`
	Capture       *bool  `json:"capture,omitempty"` // absent: capture now
}

// AuthorizeAnswer is the body of an authorization's answer: the payment and
// the result, approved, declined or pending.
type AuthorizeAnswer struct {
	Result string `json:"result"`
	Payment
}

// The results of an authorization.
const (
	ResultApproved = "approved"
	ResultDeclined = "declined"
	ResultPending  = "pending"
)

// AmountRequest is the body of a capture or a refund; no amount means all
// that is left.
type AmountRequest struct {
	Amount int64 `json:"amount,omitempty"`
}

// ReversalRequest is the body of POST /v1/reversals.
type ReversalRequest struct {
	Reference string `json:"reference"`
}

// ReversalAnswer is the answer to a reversal: every payment carrying the
// reference, as it is now.
type ReversalAnswer struct {
	Reference string    `json:"reference"`
	Status    string    `json:"status"`
	Payments  []Payment `json:"payments"`
}

func newPSPReference() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "psp_" + hex.EncodeToString(b)
}

func jsonAnswer(status int, v any, psps ...string) answer {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own types are marshalled
	}
	return answer{status: status, body: append(b, '\n'), psps: psps}
}

// apiError is the body of every error answer.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func errorAnswer(status int, code, msg string) answer {
	var e apiError
	e.Error.Code, e.Error.Message = code, msg
	return jsonAnswer(status, e)
}

func (s *Server) authorize(req AuthorizeRequest, m Method) op {
	return func(ctx context.Context, tx pgx.Tx, now time.Time) (result, error) {
		p := Payment{PSPReference: newPSPReference(), Reference: req.Reference, PaymentMethod: m.Name,
			Amount: req.Amount, Currency: req.Currency, Capture: req.Capture == nil || *req.Capture, CreatedAt: now}
		var decideAt *time.Time
		status, res := http.StatusOK, ResultApproved
		switch m.Outcome {
		case OutcomeDecline:
			p.Status, p.DeclineCode = StatusDeclined, m.DeclineCode
			status, res = http.StatusPaymentRequired, ResultDeclined
		case OutcomePending:
			p.Status = StatusPending
			at := now.Add(s.cfg.AsyncDelay)
			decideAt = &at
			status, res = http.StatusAccepted, ResultPending
		default:
			approve(&p)
		}
		if err := createPayment(ctx, tx, p, decideAt); err != nil {
			return result{}, err
		}
		if err := recordOutcome(ctx, tx, p, now); err != nil {
			return result{}, err
		}
		a := jsonAnswer(status, AuthorizeAnswer{Result: res, Payment: p}, p.PSPReference)
		return result{answer: a, keep: true, fault: m.Fault}, nil
	}
}

func approve(p *Payment) {
	p.Status, p.ApprovedAmount = StatusAuthorized, p.Amount
	if p.Capture {
		p.Status, p.CapturedAmount = StatusCaptured, p.Amount
	}
}

// recordOutcome writes the actions of a decided authorization.
func recordOutcome(ctx context.Context, tx pgx.Tx, p Payment, now time.Time) error {
	switch p.Status {
	case StatusPending:
		return nil
	case StatusDeclined:
		return recordAction(ctx, tx, p.PSPReference, actionDecline, p.Amount, now)
	}
	if err := recordAction(ctx, tx, p.PSPReference, actionAuthorize, p.ApprovedAmount, now); err != nil {
		return err
	}
	if p.CapturedAmount > 0 {
		return recordAction(ctx, tx, p.PSPReference, actionCapture, p.CapturedAmount, now)
	}
	return nil
}

// errState is an operation the payment's state does not allow.
var errState = errors.New("invalid state")

func stateError(msg string) error { return fmt.Errorf("%w: %s", errState, msg) }

// change runs f on the locked payment psp and answers it as it is after.
func change(psp string, f func(p *Payment) (kind string, amount int64, err error)) op {
	return func(ctx context.Context, tx pgx.Tx, now time.Time) (result, error) {
		p, err := lockPayment(ctx, tx, psp)
		if errors.Is(err, errNotFound) {
			return result{answer: errorAnswer(http.StatusNotFound, "payment_not_found", "no such payment"), keep: true}, nil
		}
		if err != nil {
			return result{}, err
		}
		kind, amount, err := f(&p)
		if errors.Is(err, errState) {
			a := errorAnswer(http.StatusUnprocessableEntity, "invalid_state", err.Error())
			return result{answer: a, keep: true}, nil
		}
		if err != nil {
			return result{}, err
		}
		if err := savePayment(ctx, tx, p, now); err != nil {
			return result{}, err
		}
		if err := recordAction(ctx, tx, p.PSPReference, kind, amount, now); err != nil {
			return result{}, err
		}
		return result{answer: jsonAnswer(http.StatusOK, p, p.PSPReference), keep: true}, nil
	}
}

func capture(psp string, amount int64) op {
	return change(psp, func(p *Payment) (string, int64, error) {
		left := p.ApprovedAmount - p.CapturedAmount
		if amount == 0 {
			amount = left
		}
		if (p.Status != StatusAuthorized && p.Status != StatusCaptured) || amount > left || amount <= 0 {
			return "", 0, stateError("nothing approved is left to capture for that amount")
		}
		p.CapturedAmount += amount
		p.Status = StatusCaptured
		return actionCapture, amount, nil
	})
}

func void(psp string) op {
	return change(psp, func(p *Payment) (string, int64, error) {
		if p.Status != StatusAuthorized {
			return "", 0, stateError("only an authorization with nothing captured can be voided")
		}
		p.Status = StatusVoided
		return actionVoid, p.ApprovedAmount, nil
	})
}

func refund(psp string, amount int64) op {
	return change(psp, func(p *Payment) (string, int64, error) {
		left := p.CapturedAmount - p.RefundedAmount
		if amount == 0 {
			amount = left
		}
		if p.Status != StatusCaptured || amount > left || amount <= 0 {
			return "", 0, stateError("nothing captured is left to refund for that amount")
		}
		p.RefundedAmount += amount
		return actionRefund, amount, nil
	})
}
