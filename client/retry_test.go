package client

import (
	"net/http"
	"testing"
	"time"
)

// The wait before each retry is drawn from [0, min(Base·2^(n-1), Max)] (full
// jitter) and never falls under Retry-After.
func TestBackoff(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 10, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second, MaxElapsed: time.Minute}
	for n := 1; n <= 8; n++ {
		bound := min(p.BaseDelay<<(n-1), p.MaxDelay)
		var sum time.Duration
		const draws = 2000
		for range draws {
			d := p.backoff(n, 0)
			if d < 0 || d > bound {
				t.Fatalf("attempt %d: wait %v outside [0, %v]", n, d, bound)
			}
			sum += d
		}
		// Uniform over [0, bound]: the mean is near bound/2, not pinned at an end.
		if mean := sum / draws; mean < bound*4/10 || mean > bound*6/10 {
			t.Errorf("attempt %d: mean wait %v, want about %v", n, mean, bound/2)
		}
		if d := p.backoff(n, 3*time.Second); d < 3*time.Second {
			t.Errorf("attempt %d: wait %v under Retry-After 3s", n, d)
		}
	}
	if d := p.backoff(100, 0); d > p.MaxDelay {
		t.Errorf("attempt 100: wait %v over MaxDelay (a shift overflow?)", d)
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		want   bool
	}{
		{http.StatusConflict, CodeKeyInUse, true},
		{http.StatusConflict, CodeChargeNotRefundable, false},
		{http.StatusConflict, CodeChargeNotCapturable, false},
		{http.StatusConflict, CodeChargeNotVoidable, false},
		{http.StatusTooManyRequests, "", true},
		{http.StatusInternalServerError, CodeInternalError, true},
		{http.StatusBadGateway, "", true},
		{http.StatusServiceUnavailable, CodeServiceUnavailable, true},
		{http.StatusBadRequest, CodeInvalidRequest, false},
		{http.StatusUnauthorized, CodeUnauthorized, false},
		{http.StatusPaymentRequired, CodeInsufficientFunds, false},
		{http.StatusNotFound, CodeNotFound, false},
		{http.StatusUnprocessableEntity, CodeKeyReused, false},
		{http.StatusUnprocessableEntity, CodeRefundExceedsCharge, false},
		{http.StatusUnprocessableEntity, CodeCaptureExceedsAuthorization, false},
	} {
		if got := retryable(tc.status, tc.code); got != tc.want {
			t.Errorf("retryable(%d, %q) = %v, want %v", tc.status, tc.code, got, tc.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"2":                             2 * time.Second,
		" 5 ":                           5 * time.Second,
		"-1":                            0,
		"soon":                          0,
		"99999999":                      time.Hour, // capped
		"Tue, 01 Dec 2026 12:00:30 GMT": 30 * time.Second,
		"Tue, 01 Dec 2026 11:00:00 GMT": 0, // in the past
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}
