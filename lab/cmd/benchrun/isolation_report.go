package main

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// isoResults are every mode's measurements.
type isoResults struct{ modes []modeResult }

// section renders the report's section: each phase of each mode, then the
// goals, each a median over the rounds of a ratio taken within a round.
func (r isoResults) section(s isoSettings) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Isolation between merchants\n\n")
	fmt.Fprintf(&b, "Does one merchant slow another? `make bench-isolation`, %s: merchant B charges %.0f times a second "+
		"with %d clients, each on its schedule, for %d s, alone and then while %d clients of merchant A read its charges "+
		"(`GET /v1/charges?limit=10`) at full speed, never waiting (`Retry-After` ignored); %d rounds, a CHECKPOINT "+
		"before each phase, the relay on. Load average before the run: %s. Every request of B counts: a refusal is "+
		"any answer but `201`.\n\n", time.Now().UTC().Format("2006-01-02"), s.rate, s.chargers, s.seconds, s.readers, s.rounds, s.loadBefore)
	b.WriteString("| mode | round | A's readers | B's charges/s | B's p50 ms | B's p99 ms | B refused | A's reads answered/s | A's reads refused 429/s |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.modes {
		for _, p := range m.phases {
			q := benchrun.Percentiles(p.latencies, 0.5, 0.99)
			fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %s | %d | %.0f | %.0f |\n", m.mode.name, p.round, p.readers,
				float64(p.charges[http.StatusCreated])/p.seconds, q[0], q[1], p.refused(),
				float64(p.reads[http.StatusOK])/p.seconds, float64(p.reads[http.StatusTooManyRequests])/p.seconds)
		}
	}
	b.WriteString("\n| mode | B's p50 with A's readers ÷ alone (median of rounds) | goal | B refused | goal |\n|---|---:|---|---:|---|\n")
	for _, m := range r.modes {
		ratio, refused := m.slowdown()
		verdict := "met"
		if v, ok := benchrun.Num(ratio); !ok || v > 2 {
			verdict = "missed"
		}
		refusedVerdict := "met"
		if refused > 0 {
			refusedVerdict = "missed"
		}
		fmt.Fprintf(&b, "| %s | %s | ≤ 2: %s | %d | 0: %s |\n", m.mode.name, ratio, verdict, refused, refusedVerdict)
	}
	for _, m := range r.modes {
		if h := m.holds; h != nil {
			q := benchrun.Percentiles(h.delays, 0.5, 0.99, 1)
			verdict := "met"
			if h.late > 0 || len(h.delays) == 0 {
				verdict = "missed"
			}
			fmt.Fprintf(&b, "\nHolds (%s): %d one-cent authorizations on one account of A, written by SQL, all expire at one "+
				"moment while B charges (%d clients); the sweep (`CHARGE_EXPIRY_INTERVAL=1s`, 500 holds a transaction, 100 ms apart) "+
				"recorded them all in %.1f s. B's %d `charge.succeeded` events, from their transaction's start to a NATS "+
				"subscriber meanwhile: p50 %s ms, p99 %s ms, max %s ms; %d later than 1 s (goal 0: %s).\n",
				m.mode.name, h.holds, s.chargers, h.sweep.Seconds(), len(h.delays), q[0], q[1], q[2], h.late, verdict)
		}
	}
	b.WriteString("\n")
	return b.String()
}

// slowdown is the median over the rounds of B's p50 with A's readers over
// its p50 alone, and B's refusals in every phase.
func (m modeResult) slowdown() (string, int) {
	var ratios []float64
	refused := 0
	alone := map[int]string{}
	for _, p := range m.phases {
		refused += p.refused()
		if p.readers == 0 {
			alone[p.round] = p.p50()
		}
	}
	for _, p := range m.phases {
		if p.readers > 0 {
			if v, ok := benchrun.Num(benchrun.Ratio(p.p50(), alone[p.round], 2)); ok {
				ratios = append(ratios, v)
			}
		}
	}
	med, ok := benchrun.Median(ratios)
	if !ok {
		return "n/a", refused
	}
	return benchrun.Fixed(med, 2), refused
}
