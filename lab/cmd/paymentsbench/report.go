package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// result is the report of one scenario. Its JSON form is flat (numbers, plus
// two maps of counts by status) so a shell script can read it with sed.
type result struct {
	Scenario string  `json:"scenario"`
	Clients  int     `json:"clients"`
	Seconds  float64 `json:"seconds"`
	// StartUnixMs and EndUnixMs bound the measured run (setup and verification
	// excluded), so samples taken elsewhere can be matched to it.
	StartUnixMs   int64   `json:"start_unix_ms"`
	EndUnixMs     int64   `json:"end_unix_ms"`
	Requests      int64   `json:"requests"`
	ReqPerSec     float64 `json:"req_per_s"`
	Charges       int64   `json:"charges"` // new charges: 201 not replayed
	ChargesPerSec float64 `json:"charges_per_s"`
	Replays       int64   `json:"replays"` // Idempotent-Replayed: true
	ReplaysPerSec float64 `json:"replays_per_s"`
	P50ms         float64 `json:"p50_ms"`
	P95ms         float64 `json:"p95_ms"`
	P99ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	MeanMs        float64 `json:"mean_ms"`
	// Statuses counts every answer by HTTP status ("none": no answer).
	Statuses map[string]int64 `json:"statuses"`
	// InUse counts 409 idempotency-key-in-use: the key was busy, not an error.
	InUse int64 `json:"in_use"`
	// Processing and Declined count, in the card scenario, 202 (the
	// processor had not answered within PROCESSOR_WAIT; the charge goes on
	// without the client) and 402 (the processor declined): outcomes, not
	// errors.
	Processing int64 `json:"processing"`
	Declined   int64 `json:"declined"`
	// Errors counts answers other than 201 and 409 (and, in the card
	// scenario, 202 and 402) by status.
	Errors     map[string]int64 `json:"errors"`
	ErrorCount int64            `json:"error_count"`
	// Settled is how many keys had no final answer after the run and were resent.
	Settled    int      `json:"settled"`
	Accounts   int      `json:"accounts"`
	Keys       int      `json:"keys"`
	Succeeded  int      `json:"succeeded"`
	Verified   bool     `json:"verified"`
	Mismatches []string `json:"mismatches"`
	// ServiceCPUTicks is the service's user plus system CPU time over the
	// measured run, in clock ticks (getconf CLK_TCK); only with -service-pid.
	ServiceCPUTicks *int64 `json:"service_cpu_ticks,omitempty"`
	// CPUTicks is the CPU time over the measured run, in clock ticks, of the
	// machine (every CPU, busy), the service (with -service-pid), PostgreSQL
	// (every postgres process), nats-server and paymentsbench itself; only
	// with -cpu.
	CPUTicks map[string]int64 `json:"cpu_ticks,omitempty"`
	// HeldKeyStatuses counts the answers to the -held-key client by status
	// ("none": no answer); they are not in the figures above.
	HeldKeyStatuses map[string]int64 `json:"held_key_statuses,omitempty"`
	// Events, with -events-url: the charge events of the run seen on NATS.
	Events *eventDelays `json:"events,omitempty"`
}

// eventDelays are the delays from the start of a charge's transaction to its
// event's arrival at a NATS subscriber, over the charges of the measured run.
type eventDelays struct {
	Count int64   `json:"count"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// newResult summarises a run and its verification.
func newResult(name string, clients int, st *stats, settled int, v verdict) result {
	secs := st.elapsed.Seconds()
	rate := func(n int64) float64 { return round(float64(n)/secs, 1) }
	r := result{
		Scenario: name, Clients: clients, Seconds: round(secs, 3),
		StartUnixMs: st.start.UnixMilli(), EndUnixMs: st.start.Add(st.elapsed).UnixMilli(),
		Requests: st.requests(), ReqPerSec: rate(st.requests()),
		Charges: st.charges, ChargesPerSec: rate(st.charges),
		Replays: st.replays, ReplaysPerSec: rate(st.replays),
		P50ms: millis(st.latency.quantile(0.50)), P95ms: millis(st.latency.quantile(0.95)),
		P99ms: millis(st.latency.quantile(0.99)), MaxMs: millis(st.latency.max),
		MeanMs:   millis(st.latency.mean()),
		Statuses: map[string]int64{}, Errors: map[string]int64{},
		Settled: settled, Accounts: v.accounts, Keys: v.keys, Succeeded: v.succeeded,
		Verified: v.ok(), Mismatches: v.problems(),
	}
	card := name == cardScenario
	for code, n := range st.statuses {
		label := strconv.Itoa(code)
		if code == statusNoAnswer {
			label = "none"
		}
		r.Statuses[label] = n
		switch {
		case code == http.StatusCreated:
		case code == http.StatusConflict:
			r.InUse = n
		case card && code == http.StatusAccepted:
			r.Processing = n
		case card && code == http.StatusPaymentRequired:
			r.Declined = n
		default:
			r.Errors[label] = n
			r.ErrorCount += n
		}
	}
	if r.Mismatches == nil {
		r.Mismatches = []string{}
	}
	return r
}

// writeJSON prints r as one line of JSON.
func (r result) writeJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}

// maxListed bounds the mismatches printed as text; -json lists them all.
const maxListed = 20

// writeText prints r for a person.
func (r result) writeText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d clients, %.1fs\n", r.Scenario, r.Clients, r.Seconds)
	fmt.Fprintf(&b, "  requests  %9d  %9.1f req/s\n", r.Requests, r.ReqPerSec)
	fmt.Fprintf(&b, "  charges   %9d  %9.1f charges/s (201, new)\n", r.Charges, r.ChargesPerSec)
	fmt.Fprintf(&b, "  replays   %9d  %9.1f replays/s (Idempotent-Replayed)\n", r.Replays, r.ReplaysPerSec)
	fmt.Fprintf(&b, "  latency   p50 %.2fms  p95 %.2fms  p99 %.2fms  max %.2fms  (mean %.2fms)\n",
		r.P50ms, r.P95ms, r.P99ms, r.MaxMs, r.MeanMs)
	fmt.Fprintf(&b, "  statuses  %s\n", counts(r.Statuses))
	fmt.Fprintf(&b, "  in use    %d (409 idempotency-key-in-use)\n", r.InUse)
	if r.Scenario == cardScenario {
		fmt.Fprintf(&b, "  card      %d processing (202), %d declined (402)\n", r.Processing, r.Declined)
	}
	fmt.Fprintf(&b, "  errors    %d %s\n", r.ErrorCount, counts(r.Errors))
	fmt.Fprintf(&b, "  settled   %d keys resent after the run for a final answer\n", r.Settled)
	if r.CPUTicks != nil {
		fmt.Fprintf(&b, "  cpu       clock ticks over the run: machine %d, service %d, postgres %d, nats-server %d, paymentsbench %d",
			r.CPUTicks["machine"], r.CPUTicks["service"], r.CPUTicks["postgres"], r.CPUTicks["nats-server"], r.CPUTicks["paymentsbench"])
		if n, ok := r.CPUTicks["processor"]; ok {
			fmt.Fprintf(&b, ", processor %d", n)
		}
		b.WriteString("\n")
	}
	if r.ServiceCPUTicks != nil {
		fmt.Fprintf(&b, "  service   %d clock ticks of CPU (user + system) over the run\n", *r.ServiceCPUTicks)
	}
	if e := r.Events; e != nil {
		fmt.Fprintf(&b, "  events    %d of %d charges' events on NATS; tx start to subscriber p50 %.2fms  p99 %.2fms  max %.2fms\n",
			e.Count, r.Charges, e.P50ms, e.P99ms, e.MaxMs)
	}
	if r.HeldKeyStatuses != nil {
		fmt.Fprintf(&b, "  held key  %s (the -held-key client, not counted above)\n", counts(r.HeldKeyStatuses))
	}
	if r.Verified {
		fmt.Fprintf(&b, "  verified: ok (%d accounts, %d keys, %d succeeded charges)\n", r.Accounts, r.Keys, r.Succeeded)
	} else {
		fmt.Fprintf(&b, "  verified: MISMATCH (%d problems in %d accounts, %d keys)\n", len(r.Mismatches), r.Accounts, r.Keys)
		for i, m := range r.Mismatches {
			if i == maxListed {
				fmt.Fprintf(&b, "    ... and %d more (-json lists them all)\n", len(r.Mismatches)-maxListed)
				break
			}
			fmt.Fprintf(&b, "    %s\n", m)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// counts formats counts by status as "201: 5, 402: 1", in status order.
func counts(m map[string]int64) string {
	if len(m) == 0 {
		return "(none)"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// millis converts d to milliseconds, to the microsecond.
func millis(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

// round rounds x to the given number of decimal digits.
func round(x float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(x*p) / p
}
