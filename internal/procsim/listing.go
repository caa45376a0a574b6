package procsim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// PaymentList is a page of the payments created in a time range, oldest
// first: GET /v1/payments?created_gte=&created_lt=&starting_after=&limit=.
// HasMore says a next page starts after the last payment of this one.
type PaymentList struct {
	Object  string    `json:"object"`
	Data    []Payment `json:"data"`
	HasMore bool      `json:"has_more"`
}

// MaxListLimit is the largest page of a listing, and its default.
const MaxListLimit = 100

// listPaymentsSQL pages through the payments created in [$1, $2) in
// creation order; $3, when not "", is the psp reference the page starts
// after. procsim_payments_created (store.go) serves it.
const listPaymentsSQL = `
SELECT ` + paymentColumns + ` FROM procsim_payments
WHERE created_at >= $1 AND created_at < $2
  AND ($3 = '' OR (created_at, psp_reference) >
      (SELECT created_at, psp_reference FROM procsim_payments WHERE psp_reference = $3))
ORDER BY created_at, psp_reference
LIMIT $4`

// errUnknownCursor is a starting_after that names no payment.
var errUnknownCursor = errors.New("unknown starting_after")

// List returns up to limit payments created in [since, until) after the
// payment after (none: from the first), and whether there are more. It
// returns errUnknownCursor when after names no payment.
func (s *Store) List(ctx context.Context, since, until time.Time, after string, limit int) ([]Payment, bool, error) {
	if after != "" {
		if _, err := s.Get(ctx, after); errors.Is(err, errNotFound) {
			return nil, false, errUnknownCursor
		} else if err != nil {
			return nil, false, err
		}
	}
	rows, err := s.pool.Query(ctx, listPaymentsSQL, since, until, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list payments: %w", err)
	}
	ps, err := collectPayments(rows)
	if err != nil {
		return nil, false, fmt.Errorf("list payments: %w", err)
	}
	if len(ps) > limit {
		return ps[:limit], true, nil
	}
	return ps, false, nil
}

// handleList answers a page of the payments created in a time range. Like
// the audit, it is a report of the processor's records (a reconciliation
// reads it): no fault touches it, and it marks nothing answered, so reading
// it changes nothing the decision deadline does.
func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	bad := func(msg string) {
		s.write(w, errorAnswer(http.StatusBadRequest, "invalid_request", msg))
	}
	since, err := time.Parse(time.RFC3339Nano, q.Get("created_gte"))
	if err != nil {
		bad("created_gte must be an RFC 3339 time")
		return
	}
	until, err := time.Parse(time.RFC3339Nano, q.Get("created_lt"))
	if err != nil {
		bad("created_lt must be an RFC 3339 time")
		return
	}
	limit := MaxListLimit
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > MaxListLimit {
			bad("limit must be 1 to " + strconv.Itoa(MaxListLimit))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), opTimeout)
	defer cancel()
	ps, more, err := s.store.List(ctx, since, until, q.Get("starting_after"), limit)
	switch {
	case errors.Is(err, errUnknownCursor):
		bad("starting_after names no payment")
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	if ps == nil {
		ps = []Payment{}
	}
	s.write(w, jsonAnswer(http.StatusOK, PaymentList{Object: "list", Data: ps, HasMore: more}))
}
