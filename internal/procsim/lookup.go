package procsim

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// LookupAnswer is the answer to a lookup by our reference: every payment
// carrying it, oldest first; none is an empty list, not a 404.
type LookupAnswer struct {
	Reference string    `json:"reference"`
	Payments  []Payment `json:"payments"`
}

// handleGet answers one payment by its psp reference. Lookups, like every
// answer, mark the payments they name as answered; a lookup does so before
// it reads them (even if a fault then drops its answer), so that the
// decision deadline never cancels a payment a lookup has reported live: an
// expiry either commits before the read, which then shows it, or finds the
// payment answered.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	fault := s.faults.draw()
	if fault == Fault5xxBefore {
		s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), opTimeout)
	defer cancel()
	if err := s.store.markAnswered(ctx, []string{r.PathValue("psp")}, time.Now().UTC()); err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := s.store.Get(ctx, r.PathValue("psp"))
	switch {
	case errors.Is(err, errNotFound):
		s.write(w, errorAnswer(http.StatusNotFound, "payment_not_found", "no such payment"))
	case err != nil:
		s.fail(w, r, err)
	default:
		s.play(w, r, jsonAnswer(http.StatusOK, p, p.PSPReference), fault)
	}
}

// handleLookup answers the payments carrying our reference, or, without a
// reference, a page of the payments created in a time range (handleList).
func (s *Server) handleLookup(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	if ref == "" {
		if r.URL.Query().Has("created_gte") || r.URL.Query().Has("created_lt") {
			s.handleList(w, r)
			return
		}
		s.write(w, errorAnswer(http.StatusBadRequest, "invalid_request",
			"the reference query parameter, or created_gte and created_lt, is required"))
		return
	}
	fault := s.faults.draw()
	if fault == Fault5xxBefore {
		s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), opTimeout)
	defer cancel()
	if err := s.store.markReferenceAnswered(ctx, ref, time.Now().UTC()); err != nil {
		s.fail(w, r, err)
		return
	}
	ps, err := s.store.ByReference(ctx, ref)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	psps := make([]string, 0, len(ps))
	for _, p := range ps {
		psps = append(psps, p.PSPReference)
	}
	if ps == nil {
		ps = []Payment{}
	}
	s.play(w, r, jsonAnswer(http.StatusOK, LookupAnswer{Reference: ref, Payments: ps}, psps...), fault)
}

// handleAudit answers the audit, whole or for one reference. It is the
// tests' instrument: no fault ever touches it, and it marks nothing answered.
func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	a, err := s.store.Audit(ctx, r.URL.Query().Get("reference"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.write(w, jsonAnswer(http.StatusOK, a))
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("request failed", "path", r.URL.Path, "err", err)
	s.write(w, errorAnswer(http.StatusInternalServerError, "internal", "internal error"))
}
