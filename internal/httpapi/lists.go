package httpapi

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/exactlyonce/payments/internal/payment"
)

// listQuery is the parsed query of a list endpoint.
type listQuery struct {
	limit         int
	startingAfter *uuid.UUID // nil: from the first
	values        url.Values
}

// parseListQuery reads limit (1..100, default 10) and starting_after (an id
// with prefix). Which parameters a list takes, and that each comes once, the
// route has checked (checkQuery).
func parseListQuery(r *http.Request, prefix string) (listQuery, error) {
	q := listQuery{limit: payment.DefaultPageSize, values: r.URL.Query()}
	if q.values.Has("limit") {
		v := q.values.Get("limit")
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > payment.MaxPageSize {
			return q, payment.Invalid("limit", "must be an integer from 1 to %d, got %q", payment.MaxPageSize, v)
		}
		q.limit = n
	}
	if q.values.Has("starting_after") {
		v := q.values.Get("starting_after")
		id, ok := payment.ParseID(prefix, v)
		if !ok {
			return q, payment.Invalid("starting_after", "must be an id starting with %s, got %q", prefix, v)
		}
		q.startingAfter = &id
	}
	return q, nil
}

func (s *Server) listCharges(w http.ResponseWriter, r *http.Request) {
	q, err := parseListQuery(r, payment.PrefixCharge)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	cq := payment.ChargeQuery{Limit: q.limit, StartingAfter: q.startingAfter}
	if q.values.Has("account_id") {
		v := q.values.Get("account_id")
		id, ok := payment.ParseID(payment.PrefixAccount, v)
		if !ok {
			s.fail(w, r, payment.Invalid("account_id", "must be an account id starting with acct_, got %q", v))
			return
		}
		cq.AccountID = &id
	}
	page, err := s.backend.Charges(r.Context(), merchantFrom(r.Context()), cq)
	s.answer(w, r, nameMissing(err, "account", q.values.Get("account_id")), page)
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	q, err := parseListQuery(r, payment.PrefixEvent)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, err := s.backend.Events(r.Context(), merchantFrom(r.Context()), payment.EventQuery{Limit: q.limit, StartingAfter: q.startingAfter})
	s.answer(w, r, err, page)
}

// getEvent answers one event as the feed lists it: the same object, and 404
// for an event the feed does not list (yet), as for another merchant's.
func (s *Server) getEvent(w http.ResponseWriter, r *http.Request) {
	id := pathID(r, "id", payment.PrefixEvent)
	e, err := s.backend.Event(r.Context(), merchantFrom(r.Context()), id)
	s.answer(w, r, nameMissing(err, "event", chi.URLParam(r, "id")), e)
}
