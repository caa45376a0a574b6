package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/exactlyonce/payments/internal/payment"
)

// readinessMsg is the message of /readyz's log lines.
const readinessMsg = "readiness"

// notReady answers a /readyz that found err with 503, and logs it only as a
// change of state (retry.Outage): ready → not ready at WARN with the reason,
// a reminder at most once a minute while it lasts (with how long and how many
// probes failed), and not ready → ready at INFO when a probe succeeds
// (readyz). A probe every second through an outage of N minutes writes about
// N lines, not one per probe. A probe whose client left tells nothing, and
// neither does one that finds the process draining (payment.ErrShuttingDown):
// a drain is planned, not an outage, and the process that began it says so
// at INFO; its load balancer is meant to see this 503.
func (s *Server) notReady(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, payment.ErrShuttingDown) {
		s.answerFailure(w, r, err)
		return
	}
	if !errors.Is(err, payment.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", payment.ErrUnavailable, err)
	}
	if r.Context().Err() == nil {
		s.readiness.Failed(err)
	}
	s.answerFailure(w, r, err)
}
