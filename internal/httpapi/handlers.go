package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/charging/chargedb"
	"github.com/exactlyonce/payments/internal/idempotency"
	"github.com/exactlyonce/payments/internal/payment"
)

type accountRequest struct {
	Currency    string            `json:"currency"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
}

func (s *Server) createAccount(w http.ResponseWriter, r *http.Request) {
	var in accountRequest
	req, ok := s.readPost(w, r, &in)
	if !ok {
		return
	}
	na := payment.NewAccount{Currency: in.Currency, Description: in.Description, Metadata: in.Metadata}
	if err := na.Validate(); err != nil {
		s.fail(w, r, err)
		return
	}
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		a, err := l.CreateAccount(ctx, req.MerchantID, na)
		if err != nil {
			return response{}, err
		}
		return created("/v1/accounts/"+payment.FormatID(payment.PrefixAccount, a.ID), a)
	})
}

func (s *Server) getAccount(w http.ResponseWriter, r *http.Request) {
	id := pathID(r, "id", payment.PrefixAccount)
	a, err := s.backend.Account(r.Context(), merchantFrom(r.Context()), id)
	s.answer(w, r, nameMissing(err, "account", chi.URLParam(r, "id")), a)
}

type depositRequest struct {
	Amount *int64 `json:"amount"`
}

func (s *Server) createDeposit(w http.ResponseWriter, r *http.Request) {
	var in depositRequest
	req, ok := s.readPost(w, r, &in)
	if !ok {
		return
	}
	if err := requireAmount(in.Amount); err != nil {
		s.fail(w, r, err)
		return
	}
	// A malformed account id is an unknown account: the 404 is stored like any
	// other outcome of the claimed key.
	accountID := pathID(r, "id", payment.PrefixAccount)
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		d, err := l.Deposit(ctx, req.MerchantID, accountID, *in.Amount)
		if err != nil {
			return response{}, nameMissing(err, "account", chi.URLParam(r, "id"))
		}
		return created(fmt.Sprintf("/v1/accounts/%s/deposits/%s",
			payment.FormatID(payment.PrefixAccount, d.AccountID), payment.FormatID(payment.PrefixDeposit, d.ID)), d)
	})
}

func (s *Server) getDeposit(w http.ResponseWriter, r *http.Request) {
	accountID := pathID(r, "id", payment.PrefixAccount)
	id := pathID(r, "depositID", payment.PrefixDeposit)
	d, err := s.backend.Deposit(r.Context(), merchantFrom(r.Context()), accountID, id)
	s.answer(w, r, nameMissing(err, "deposit", chi.URLParam(r, "depositID")), d)
}

type chargeRequest struct {
	// Exactly one of AccountID (a charge of an account here) and
	// PaymentMethod (a card at the processor).
	AccountID     string            `json:"account_id"`
	PaymentMethod string            `json:"payment_method"`
	Amount        *int64            `json:"amount"`
	Currency      string            `json:"currency"`
	Description   *string           `json:"description"`
	Metadata      map[string]string `json:"metadata"`
	// Capture false authorizes: the amount is held until captured, voided
	// or expired. Absent is true.
	Capture *bool `json:"capture"`
}

// errPayer refuses a charge that names both an account and a payment
// method, or neither.
var errPayer = &payment.ValidationError{Field: "account_id",
	Message: "give exactly one of account_id (a charge of an account) and payment_method (a card at the processor)"}

// toCard reads a charge of a payment method, once toDomain's caller knows
// it names one.
func (r chargeRequest) toCard() (payment.NewCardCharge, error) {
	if err := requireAmount(r.Amount); err != nil {
		return payment.NewCardCharge{}, err
	}
	nc := payment.NewCardCharge{PaymentMethod: r.PaymentMethod, Amount: *r.Amount, Currency: r.Currency,
		Description: r.Description, Metadata: r.Metadata, Authorize: r.Capture != nil && !*r.Capture}
	return nc, nc.Validate()
}

func (r chargeRequest) toDomain() (payment.NewCharge, error) {
	if r.AccountID == "" {
		return payment.NewCharge{}, &payment.ValidationError{Field: "account_id", Message: "is required"}
	}
	accountID, ok := payment.ParseID(payment.PrefixAccount, r.AccountID)
	if !ok {
		return payment.NewCharge{}, &payment.ValidationError{Field: "account_id",
			Message: "must be an account id: acct_ followed by 32 lowercase hex digits"}
	}
	if err := requireAmount(r.Amount); err != nil {
		return payment.NewCharge{}, err
	}
	nc := payment.NewCharge{AccountID: accountID, Amount: *r.Amount, Currency: r.Currency,
		Description: r.Description, Metadata: r.Metadata, Authorize: r.Capture != nil && !*r.Capture}
	return nc, nc.Validate()
}

func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	var in chargeRequest
	req, ok := s.readPost(w, r, &in)
	if !ok {
		return
	}
	if (in.AccountID == "") == (in.PaymentMethod == "") {
		s.fail(w, r, errPayer)
		return
	}
	if in.PaymentMethod != "" {
		card, err := in.toCard()
		if err != nil {
			s.fail(w, r, err)
			return
		}
		s.createCardCharge(w, r, req, card)
		return
	}
	nc, err := in.toDomain()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The charge's outcome, as the store decided it, for the metric; the
	// render may run on the batch's goroutine, hence the atomic.
	var outcome atomic.Pointer[payment.ChargeStatus]
	render := func(c payment.Charge, body []byte, err error) (response, error) {
		if err != nil {
			return refusal(nameMissing(err, "account", in.AccountID))
		}
		outcome.Store(&c.Status)
		if c.Status == payment.ChargeFailed {
			return refusal(&payment.FailedCharge{Charge: c})
		}
		return response{Status: http.StatusCreated, Location: "/v1/charges/" + payment.FormatID(payment.PrefixCharge, c.ID),
			Body: append(body, '\n')}, nil
	}
	res := s.executeWith(w, r, req, func(ctx context.Context) (idempotency.Result, error) {
		return s.backend.CreateCharge(ctx, chargedb.KeyedCharge{Request: req, Charge: nc, Render: render})
	})
	if status := outcome.Load(); status != nil && res.Status != 0 && !res.Replayed {
		s.opts.Metrics.Charge(string(*status))
	}
}

func (s *Server) getCharge(w http.ResponseWriter, r *http.Request) {
	id := pathID(r, "id", payment.PrefixCharge)
	c, err := s.backend.Charge(r.Context(), merchantFrom(r.Context()), id)
	s.answer(w, r, nameMissing(err, "charge", chi.URLParam(r, "id")), c)
}

// amountRequest is the body of a refund or a capture: an amount, or, left
// out, all there is.
type amountRequest struct {
	Amount *int64 `json:"amount"`
}

// readAmount reads a refund's or a capture's body with read (readPost, or
// readOptionalPost when the body may be left out) and checks its amount.
func (s *Server) readAmount(w http.ResponseWriter, r *http.Request,
	read func(http.ResponseWriter, *http.Request, any) (idempotency.Request, bool)) (idempotency.Request, *int64, bool) {
	var in amountRequest
	req, ok := read(w, r, &in)
	if !ok {
		return req, nil, false
	}
	if in.Amount != nil {
		if err := payment.ValidateAmount("amount", *in.Amount); err != nil {
			s.fail(w, r, err)
			return req, nil, false
		}
	}
	return req, in.Amount, true
}

func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	req, amount, ok := s.readAmount(w, r, s.readPost)
	if !ok {
		return
	}
	chargeID := pathID(r, "id", payment.PrefixCharge)
	if s.isCardCharge(r.Context(), req.MerchantID, chargeID) {
		s.cardOperation(w, r, req, func(ctx context.Context) (idempotency.Result, string, any, error) {
			res, rf, err := s.opts.Cards.Refund(ctx, req, chargeID, amount)
			if rf == nil {
				return res, "", nil, err
			}
			return res, refundLocation(*rf), rf, err
		})
		return
	}
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		rf, err := l.Refund(ctx, req.MerchantID, chargeID, amount)
		if err != nil {
			return response{}, nameMissing(err, "charge", chi.URLParam(r, "id"))
		}
		return created(fmt.Sprintf("/v1/charges/%s/refunds/%s",
			payment.FormatID(payment.PrefixCharge, rf.ChargeID), payment.FormatID(payment.PrefixRefund, rf.ID)), rf)
	})
}

// captureCharge takes all or part of an authorized charge (POST
// /v1/charges/{id}/capture): 200 with the charge.
func (s *Server) captureCharge(w http.ResponseWriter, r *http.Request) {
	req, amount, ok := s.readAmount(w, r, s.readOptionalPost)
	if !ok {
		return
	}
	chargeID := pathID(r, "id", payment.PrefixCharge)
	if s.isCardCharge(r.Context(), req.MerchantID, chargeID) {
		s.cardOperation(w, r, req, func(ctx context.Context) (idempotency.Result, string, any, error) {
			return asAny(s.opts.Cards.Capture(ctx, req, chargeID, amount))
		})
		return
	}
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		c, err := l.Capture(ctx, req.MerchantID, chargeID, amount)
		if err != nil {
			return response{}, nameMissing(err, "charge", chi.URLParam(r, "id"))
		}
		return jsonResponse(http.StatusOK, "", c)
	})
}

// voidCharge releases an authorized charge's hold (POST
// /v1/charges/{id}/void): 200 with the charge. It takes no fields.
func (s *Server) voidCharge(w http.ResponseWriter, r *http.Request) {
	var in struct{}
	req, ok := s.readOptionalPost(w, r, &in)
	if !ok {
		return
	}
	chargeID := pathID(r, "id", payment.PrefixCharge)
	if s.isCardCharge(r.Context(), req.MerchantID, chargeID) {
		s.cardOperation(w, r, req, func(ctx context.Context) (idempotency.Result, string, any, error) {
			return asAny(s.opts.Cards.Void(ctx, req, chargeID))
		})
		return
	}
	s.execute(w, r, req, func(ctx context.Context, l payment.Ledger) (response, error) {
		c, err := l.Void(ctx, req.MerchantID, chargeID)
		if err != nil {
			return response{}, nameMissing(err, "charge", chi.URLParam(r, "id"))
		}
		return jsonResponse(http.StatusOK, "", c)
	})
}

func (s *Server) getRefund(w http.ResponseWriter, r *http.Request) {
	chargeID := pathID(r, "id", payment.PrefixCharge)
	id := pathID(r, "refundID", payment.PrefixRefund)
	rf, err := s.backend.Refund(r.Context(), merchantFrom(r.Context()), chargeID, id)
	s.answer(w, r, nameMissing(err, "refund", chi.URLParam(r, "refundID")), rf)
}

func requireAmount(amount *int64) error {
	if amount == nil {
		return &payment.ValidationError{Field: "amount", Message: "is required"}
	}
	return payment.ValidateAmount("amount", *amount)
}

// nameMissing adds the object a not-found error is about, so the problem's detail
// says which one; other errors pass unchanged.
func nameMissing(err error, kind, id string) error {
	if errors.Is(err, payment.ErrNotFound) || errors.Is(err, payment.ErrAccountNotFound) {
		return fmt.Errorf("%w: your merchant has no %s %q", err, kind, id)
	}
	return err
}

// pathID parses a prefixed id from the path. A malformed id yields uuid.Nil,
// which matches no object, so it reads as unknown.
func pathID(r *http.Request, param, prefix string) uuid.UUID {
	id, _ := payment.ParseID(prefix, chi.URLParam(r, param))
	return id
}

// answer writes a read's result: 200 with v as JSON, or err's problem.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, err error, v any) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resp, err := jsonResponse(http.StatusOK, "", v)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeResponse(w, resp, false)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	resp, _ := jsonResponse(http.StatusOK, "", map[string]string{"status": "ok"})
	writeResponse(w, resp, false)
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.backend.Ready(ctx); err != nil {
		s.notReady(w, r, err)
		return
	}
	s.readiness.Succeeded()
	resp, _ := jsonResponse(http.StatusOK, "", map[string]string{"status": "ready"})
	writeResponse(w, resp, false)
}

func (s *Server) spec(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(s.opts.Spec)
}

func (s *Server) problemDoc(w http.ResponseWriter, r *http.Request) {
	slug := chi.URLParam(r, "slug")
	for _, p := range problemCatalogue {
		if p.slug == slug {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = fmt.Fprintf(w, "%s (HTTP %d)\n\n%s\n", p.title, p.status, p.about)
			return
		}
	}
	s.fail(w, r, refused{"no such problem type", payment.ErrNotFound})
}
