package procsim_test

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/payments/internal/procsim"
)

// TestListByCreation pages through the payments created in a time range,
// oldest first: every payment once, in order, whatever the page size; the
// range's end excluded; an unanswered approval left unanswered by the
// listing (it is a report, as the audit is); and bad parameters refused.
func TestListByCreation(t *testing.T) {
	t.Parallel()
	s := startSim(t)
	since := time.Now().Add(-time.Second)
	var want []string
	for i, method := range []string{"pm_card_approve", "pm_card_decline_do_not_honor", "pm_card_approve", "pm_card_approve", "pm_card_approve"} {
		ref := "ref_list_" + strconv.Itoa(i)
		p := decode[procsim.AuthorizeAnswer](t, s.authorize("kl"+strconv.Itoa(i), auth(ref, method, int64(100+i))))
		want = append(want, p.PSPReference)
	}
	// An approval whose answer is dropped: only the decision deadline, or
	// a lookup, may touch it.
	if _, err := s.do(client(5*time.Second), http.MethodPost, "/v1/authorizations", "kl-lost",
		auth("ref_list_lost", "pm_card_approve_lose_response", 700)); err == nil {
		t.Fatal("the lost answer was answered")
	}
	lost := s.audit("ref_list_lost").Payments[0].PSPReference
	want = append(want, lost)
	until := time.Now().Add(time.Second)

	list := func(gte, lt time.Time, after string, limit int) procsim.PaymentList {
		t.Helper()
		q := url.Values{"created_gte": {gte.Format(time.RFC3339Nano)}, "created_lt": {lt.Format(time.RFC3339Nano)}}
		if after != "" {
			q.Set("starting_after", after)
		}
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		r := s.must(http.MethodGet, "/v1/payments?"+q.Encode(), "", nil)
		if r.status != http.StatusOK {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
		return decode[procsim.PaymentList](t, r)
	}
	for _, limit := range []int{0, 1, 2, 6} {
		var got []string
		after, pages := "", 0
		for {
			page := list(since, until, after, limit)
			pages++
			for _, p := range page.Data {
				got = append(got, p.PSPReference)
			}
			if !page.HasMore {
				break
			}
			after = page.Data[len(page.Data)-1].PSPReference
		}
		if !slices.Equal(got, want) {
			t.Errorf("limit %d: listed %v, want %v", limit, got, want)
		}
		if limit > 0 && pages != (len(want)+limit-1)/limit {
			t.Errorf("limit %d: %d pages for %d payments", limit, pages, len(want))
		}
	}
	all := list(since, until, "", 0).Data
	if p := all[1]; p.Status != procsim.StatusDeclined || p.Amount != 101 || p.Reference != "ref_list_1" || p.CreatedAt.IsZero() {
		t.Errorf("the declined payment listed as %+v", p)
	}
	// The range ends before its end: a payment created at created_lt is
	// the next range's.
	if got := list(since, all[2].CreatedAt, "", 0).Data; len(got) != 2 || got[1].PSPReference != want[1] {
		t.Errorf("up to the third payment's creation: %v", got)
	}
	if got := list(all[2].CreatedAt, until, "", 0).Data; len(got) != 4 || got[0].PSPReference != want[2] {
		t.Errorf("from the third payment's creation: %v", got)
	}
	if a := s.audit("ref_list_lost").Payments[0]; a.Answered {
		t.Error("the listing marked the unanswered approval answered")
	}

	gte, lt := url.QueryEscape(since.Format(time.RFC3339Nano)), url.QueryEscape(until.Format(time.RFC3339Nano))
	for _, q := range []string{"", "created_gte=" + gte, "created_gte=yesterday&created_lt=" + lt,
		"created_gte=" + gte + "&created_lt=" + lt + "&limit=0", "created_gte=" + gte + "&created_lt=" + lt + "&limit=101",
		"created_gte=" + gte + "&created_lt=" + lt + "&starting_after=psp_none"} {
		if r := s.must(http.MethodGet, "/v1/payments?"+q, "", nil); r.status != http.StatusBadRequest {
			t.Errorf("GET /v1/payments?%s: %d %s, want 400", q, r.status, r.body)
		}
	}
}
