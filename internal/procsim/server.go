// Package procsim is a card processor simulator: a separate process (cmd/procsim)
// that speaks HTTP and JSON like Adyen or Stripe, keeps its state in a
// PostgreSQL database of its own, and misbehaves on request. Its test payment
// methods approve, decline, lose the answer, answer late, fail before or
// after processing, answer later by a signed webhook, or refuse reversals; a
// seeded random-fault mode does the same at random; its audit lists what was
// really done to every reference. docs/processors.md describes the API.
package procsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server answers the simulator's API and runs its background work (Run).
type Server struct {
	cfg      Config
	store    *Store
	log      *slog.Logger
	faults   *faults
	webhooks *http.Client
}

// NewServer returns a simulator over store. cfg must be valid (Config.Validate).
func NewServer(cfg Config, store *Store, log *slog.Logger) *Server {
	return &Server{cfg: cfg, store: store, log: log, faults: newFaults(cfg.FaultRate, cfg.FaultSeed),
		webhooks: &http.Client{Timeout: 5 * time.Second}}
}

// maxBody bounds a request body.
const maxBody = 64 << 10

// opTimeout bounds an operation's transaction, waiting for its key included.
const opTimeout = 10 * time.Second

// Handler returns the simulator's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("POST /v1/authorizations", s.handleAuthorize)
	mux.HandleFunc("POST /v1/payments/{psp}/captures", s.handleAmount(capture))
	mux.HandleFunc("POST /v1/payments/{psp}/refunds", s.handleAmount(refund))
	mux.HandleFunc("POST /v1/payments/{psp}/voids", s.handleVoid)
	mux.HandleFunc("POST /v1/reversals", s.handleReversal)
	mux.HandleFunc("GET /v1/payments/{psp}", s.handleGet)
	mux.HandleFunc("GET /v1/payments", s.handleLookup)
	mux.HandleFunc("GET /v1/audit", s.handleAudit)
	return mux
}

// request reads the body and the key of a POST; on a bad one it has answered
// 400 and ok is false.
func (s *Server) request(w http.ResponseWriter, r *http.Request, v any) (key string, body []byte, ok bool) {
	key = r.Header.Get("Idempotency-Key")
	if !validKey(key) {
		s.write(w, errorAnswer(http.StatusBadRequest, "idempotency_key_invalid",
			"an Idempotency-Key header of 1 to 255 visible ASCII characters is required"))
		return "", nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil && v != nil {
		err = decodeStrict(body, v)
	}
	if err != nil {
		s.write(w, errorAnswer(http.StatusBadRequest, "invalid_request", "the body is not the JSON this route takes"))
		return "", nil, false
	}
	return key, body, true
}

func validKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := range len(k) {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

func decodeStrict(body []byte, v any) error {
	if len(body) == 0 {
		body = []byte("{}")
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

func (s *Server) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	var req AuthorizeRequest
	key, body, ok := s.request(w, r, &req)
	if !ok {
		return
	}
	if msg := validateAuthorize(req); msg != "" {
		s.write(w, errorAnswer(http.StatusBadRequest, "invalid_request", msg))
		return
	}
	m, known := LookupMethod(req.PaymentMethod)
	if !known {
		s.write(w, errorAnswer(http.StatusBadRequest, "unknown_payment_method", "no such test payment method"))
		return
	}
	if m.Fault == Fault5xxBefore {
		s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
		return
	}
	s.keyed(w, r, key, body, s.authorize(req, m))
}

func validateAuthorize(req AuthorizeRequest) string {
	switch {
	case req.Amount <= 0 || req.Amount > 1e12:
		return "amount must be a positive number of minor units"
	case len(req.Currency) != 3:
		return "currency must be an ISO 4217 code"
	case req.Reference == "" || len(req.Reference) > 128:
		return "reference (yours) must have 1 to 128 characters"
	}
	return ""
}

func (s *Server) handleAmount(f func(psp string, amount int64) op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req AmountRequest
		key, body, ok := s.request(w, r, &req)
		if !ok {
			return
		}
		if req.Amount < 0 {
			s.write(w, errorAnswer(http.StatusBadRequest, "invalid_request", "amount must not be negative"))
			return
		}
		s.keyed(w, r, key, body, f(r.PathValue("psp"), req.Amount))
	}
}

func (s *Server) handleVoid(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	if key, body, ok := s.request(w, r, &req); ok {
		s.keyed(w, r, key, body, void(r.PathValue("psp")))
	}
}

func (s *Server) handleReversal(w http.ResponseWriter, r *http.Request) {
	var req ReversalRequest
	key, body, ok := s.request(w, r, &req)
	if !ok {
		return
	}
	if req.Reference == "" {
		s.write(w, errorAnswer(http.StatusBadRequest, "invalid_request", "reference is required"))
		return
	}
	s.keyed(w, r, key, body, reverse(req.Reference))
}

// keyed runs o under key: the first request with the key executes it and
// keeps its answer; a later one with the same body replays that answer byte
// for byte, and one with another body is refused (422). A request whose key
// another holds waits for it. The fault is drawn per request; a method's own
// fault plays only when the operation executes, never on a replay.
func (s *Server) keyed(w http.ResponseWriter, r *http.Request, key string, body []byte, o op) {
	fault := s.faults.draw()
	if fault == Fault5xxBefore {
		s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
		return
	}
	fp := fingerprint(r.Method, r.URL.Path, body)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	var res result
	replayed := false
	err := s.store.inTx(ctx, func(tx pgx.Tx) error {
		now := dbNow()
		stored, claimed, err := claimKey(ctx, tx, key, fp, now)
		if err != nil || !claimed {
			res.answer, replayed = stored, true
			return err
		}
		if res, err = o(ctx, tx, now); err != nil {
			return err
		}
		if res.keep {
			return storeKey(ctx, tx, key, res.answer)
		}
		return releaseKey(ctx, tx, key)
	})
	switch {
	case errors.Is(err, errKeyReused):
		s.write(w, errorAnswer(http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this Idempotency-Key was used with another request"))
		return
	case err != nil:
		s.log.Error("operation failed", "path", r.URL.Path, "err", err)
		s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	} else if fault == FaultNone {
		fault = res.fault
	}
	s.play(w, r, res.answer, fault)
}

// play answers a as fault says, and records which payments were answered.
func (s *Server) play(w http.ResponseWriter, r *http.Request, a answer, fault Fault) {
	switch fault {
	case Fault5xxBefore, Fault5xxAfter:
		s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
		return
	case FaultLoseResponse:
		// The server closes the connection without a byte of answer.
		panic(http.ErrAbortHandler)
	case FaultAnswerLate, FaultSlow:
		delay := s.cfg.SlowDelay
		if fault == FaultAnswerLate {
			delay = s.cfg.LateDelay
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return // the caller is gone: nothing was answered
		}
	}
	if s.send(w, a) == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.store.markAnswered(ctx, a.psps, time.Now().UTC()); err != nil {
			s.log.Error("mark answered", "err", err)
		}
	}
}

// write answers a; an answer the caller did not get needs nothing done.
func (s *Server) write(w http.ResponseWriter, a answer) { _ = s.send(w, a) }

// send answers a and reports whether it reached the connection.
func (s *Server) send(w http.ResponseWriter, a answer) error {
	w.Header().Set("Content-Type", "application/json")
	if a.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(a.status)
	if _, err := w.Write(a.body); err != nil {
		return fmt.Errorf("write answer: %w", err)
	}
	return http.NewResponseController(w).Flush()
}
