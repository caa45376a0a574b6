// Package stripefake is a Stripe-shaped fake for tests, where stripe-mock
// (which keeps no state) cannot help: PaymentIntents created, confirmed,
// captured and cancelled, refunds, Stripe's idempotency (the same key and
// parameters: the first answer; other parameters: an idempotency_error), a
// search that lags behind creation as Stripe's does, and faults the test
// queues: an answer lost after the intent was created, a 409 key in use, a
// 429, a 500, a 401. Only what the connector (internal/processor/stripeproc)
// sends is served.
package stripefake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Fault is what the next request is answered with instead of its work.
type Fault string

// The faults. LoseAnswer does the request, then drops the connection.
const (
	LoseAnswer  Fault = "lose_answer"
	KeyInUse    Fault = "409"
	RateLimited Fault = "429"
	ServerError Fault = "500"
	BadAPIKey   Fault = "401"
	// OtherParameters answers as Stripe does a key that came before with
	// other parameters (400 idempotency_error), whatever the request.
	OtherParameters Fault = "idempotency_error"
)

// Intent is a PaymentIntent as the fake keeps it.
type Intent struct {
	ID             string
	Amount         int64
	Currency       string
	PaymentMethod  string
	CaptureMethod  string
	Status         string
	AmountReceived int64
	AmountRefunded int64
	Reference      string
	Created        time.Time
	DeclineCode    string
}

// Server is the fake.
type Server struct {
	URL string
	// SearchLag is how long after its creation an intent is found by a
	// search (Stripe indexes within about a minute).
	SearchLag time.Duration

	mu      sync.Mutex
	intents []*Intent
	keys    map[string]stored
	faults  []Fault
	seq     int
	// Requests counts every request by "METHOD path".
	requests map[string]int
}

type stored struct {
	params string
	status int
	body   []byte
}

// Start runs a fake for t, stopped when t ends.
func Start(t testing.TB) *Server {
	s := &Server{keys: map[string]stored{}, requests: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Fail queues faults, one per request to come.
func (s *Server) Fail(f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f...)
}

// Intents returns a copy of every intent created.
func (s *Server) Intents() []Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Intent, len(s.intents))
	for i, in := range s.intents {
		out[i] = *in
	}
	return out
}

// Requests returns how many "METHOD path" requests came.
func (s *Server) Requests(methodPath string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[methodPath]
}

// apiError is an error answer as Stripe gives it.
type apiError struct {
	status         int
	typ, code, msg string
}

func (e apiError) write(w http.ResponseWriter) { writeError(w, e.status, e.typ, e.code, "", e.msg) }

// faultErrors are the answers of the faults that answer instead of doing
// the request; OtherParameters is also how a key sent again with other
// parameters is answered.
var faultErrors = map[Fault]apiError{
	KeyInUse:    {http.StatusConflict, "invalid_request_error", "idempotency_key_in_use", "a request with this key is in flight"},
	RateLimited: {http.StatusTooManyRequests, "invalid_request_error", "rate_limit", "too many requests"},
	ServerError: {http.StatusInternalServerError, "api_error", "", "something went wrong"},
	BadAPIKey:   {http.StatusUnauthorized, "invalid_request_error", "", "invalid API key"},
	OtherParameters: {http.StatusBadRequest, "idempotency_error", "",
		"Keys for idempotent requests can only be used with the same parameters they were first used with."},
}

var (
	intentPath = regexp.MustCompile(`^/v1/payment_intents/(pi_[0-9]+)/(capture|cancel)$`)
	queryRef   = regexp.MustCompile(`^metadata\['reference'\]:'(.*)'$`)
)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	path := r.URL.Path
	if m := intentPath.FindStringSubmatch(path); m != nil {
		path = "/v1/payment_intents/{id}/" + m[2]
	}
	s.requests[r.Method+" "+path]++
	var fault Fault
	if len(s.faults) > 0 {
		fault, s.faults = s.faults[0], s.faults[1:]
	}
	if e, ok := faultErrors[fault]; ok {
		e.write(w)
		return
	}
	rec := httptest.NewRecorder()
	s.route(rec, r)
	if fault == LoseAnswer {
		// Done, and the answer never reaches the caller.
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// route does a request's work, under its idempotency key if it has one.
func (s *Server) route(w *httptest.ResponseRecorder, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	params := r.Method + " " + r.URL.Path + "?" + r.PostForm.Encode()
	if key != "" && r.Method == http.MethodPost {
		if st, ok := s.keys[key]; ok {
			if st.params != params {
				faultErrors[OtherParameters].write(w)
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(st.status)
			_, _ = w.Write(st.body)
			return
		}
		defer func() { s.keys[key] = stored{params: params, status: w.Code, body: w.Body.Bytes()} }()
	}
	m := intentPath.FindStringSubmatch(r.URL.Path)
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents":
		s.create(w, r)
	case r.Method == http.MethodPost && m != nil:
		s.change(w, r, m[1], m[2])
	case r.Method == http.MethodPost && r.URL.Path == "/v1/refunds":
		s.refund(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/payment_intents/search":
		s.search(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/payment_intents":
		s.list(w, r)
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "", "unrecognized request URL")
	}
}

// create creates and confirms an intent. pm_card_visa is approved;
// pm_card_chargeDeclinedInsufficientFunds declined; any other method does
// not exist.
func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	amount, _ := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
	s.seq++
	in := &Intent{ID: fmt.Sprintf("pi_%d", s.seq), Amount: amount, Currency: r.PostForm.Get("currency"),
		PaymentMethod: r.PostForm.Get("payment_method"), CaptureMethod: r.PostForm.Get("capture_method"),
		Reference: r.PostForm.Get("metadata[reference]"), Created: time.Now()}
	switch in.PaymentMethod {
	case "pm_card_visa":
		in.Status, in.AmountReceived = "succeeded", amount
		if in.CaptureMethod == "manual" {
			in.Status, in.AmountReceived = "requires_capture", 0
		}
	case "pm_card_chargeDeclinedInsufficientFunds":
		in.Status, in.DeclineCode = "requires_payment_method", "insufficient_funds"
	default:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "resource_missing", "", "No such PaymentMethod: '"+in.PaymentMethod+"'")
		return
	}
	s.intents = append(s.intents, in)
	if in.DeclineCode != "" {
		writeError(w, http.StatusPaymentRequired, "card_error", "card_declined", in.DeclineCode, "Your card has insufficient funds.", in)
		return
	}
	writeJSON(w, http.StatusOK, intentJSON(in))
}

func (s *Server) find(id string) *Intent {
	i := slices.IndexFunc(s.intents, func(in *Intent) bool { return in.ID == id })
	if i < 0 {
		return nil
	}
	return s.intents[i]
}

// change captures or cancels an intent.
func (s *Server) change(w http.ResponseWriter, r *http.Request, id, what string) {
	in := s.find(id)
	switch {
	case in == nil:
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "", "No such payment_intent")
		return
	case what == "capture" && in.Status == "requires_capture":
		in.Status, in.AmountReceived = "succeeded", in.Amount
		if a, err := strconv.ParseInt(r.PostForm.Get("amount_to_capture"), 10, 64); err == nil {
			in.AmountReceived = a
		}
	case what == "cancel" && in.Status != "succeeded" && in.Status != "canceled":
		in.Status = "canceled"
	default:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "payment_intent_unexpected_state", "",
			"This PaymentIntent's status is "+in.Status)
		return
	}
	writeJSON(w, http.StatusOK, intentJSON(in))
}

// refund refunds a captured intent.
func (s *Server) refund(w http.ResponseWriter, r *http.Request) {
	in := s.find(r.PostForm.Get("payment_intent"))
	if in == nil || in.Status != "succeeded" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "charge_not_refundable", "", "not refundable")
		return
	}
	amount := in.AmountReceived - in.AmountRefunded
	if a, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64); err == nil {
		amount = a
	}
	if amount > in.AmountReceived-in.AmountRefunded {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "amount_too_large", "", "refund exceeds what is left")
		return
	}
	in.AmountRefunded += amount
	s.seq++
	writeJSON(w, http.StatusOK, map[string]any{"id": fmt.Sprintf("re_%d", s.seq), "object": "refund", "amount": amount,
		"payment_intent": in.ID, "status": "succeeded", "currency": in.Currency})
}

// search finds the intents carrying a reference, created SearchLag ago or
// earlier.
func (s *Server) search(w http.ResponseWriter, r *http.Request) {
	m := queryRef.FindStringSubmatch(r.URL.Query().Get("query"))
	if m == nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "unsupported query")
		return
	}
	data := []any{}
	for _, in := range s.intents {
		if in.Reference == m[1] && time.Since(in.Created) >= s.SearchLag {
			data = append(data, intentJSON(in))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "search_result", "data": data, "has_more": false, "url": "/v1/payment_intents/search"})
}

// list lists the intents created in [created[gte], created[lt]), newest
// first, a page of limit (default 10) after starting_after, as Stripe does.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	gte, _ := strconv.ParseInt(q.Get("created[gte]"), 10, 64)
	lt, err := strconv.ParseInt(q.Get("created[lt]"), 10, 64)
	if err != nil {
		lt = 1 << 62
	}
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit <= 0 {
		limit = 10
	}
	var page []any
	after, skipping := q.Get("starting_after"), q.Get("starting_after") != ""
	more := false
	for i := len(s.intents) - 1; i >= 0; i-- {
		in := s.intents[i]
		if c := in.Created.Unix(); c < gte || c >= lt {
			continue
		}
		if skipping {
			skipping = in.ID != after
			continue
		}
		if len(page) == limit {
			more = true
			break
		}
		page = append(page, intentJSON(in))
	}
	if page == nil {
		page = []any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": page, "has_more": more, "url": "/v1/payment_intents"})
}

func intentJSON(in *Intent) map[string]any {
	v := map[string]any{"id": in.ID, "object": "payment_intent", "amount": in.Amount, "currency": in.Currency,
		"status": in.Status, "capture_method": in.CaptureMethod, "amount_received": in.AmountReceived,
		"created": in.Created.Unix(), "metadata": map[string]string{"reference": in.Reference},
		"payment_method": in.PaymentMethod,
		"latest_charge":  map[string]any{"id": "ch_of_" + in.ID, "object": "charge", "amount_refunded": in.AmountRefunded}}
	if in.DeclineCode != "" {
		v["last_payment_error"] = map[string]any{"type": "card_error", "code": "card_declined", "decline_code": in.DeclineCode}
	}
	return v
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, typ, code, decline, msg string, in ...*Intent) {
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	if decline != "" {
		e["decline_code"] = decline
	}
	if len(in) > 0 {
		e["payment_intent"] = intentJSON(in[0])
	}
	writeJSON(w, status, map[string]any{"error": e})
}
