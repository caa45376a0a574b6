package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// pairResult is one measurement of benchrun pair: paymentsbench's JSON
// line of the fresh scenario with the side, relay and round in front.
type pairResult struct {
	Side        string             `json:"side"`
	Relay       string             `json:"relay"`
	Round       int                `json:"round"`
	Charges     float64            `json:"charges"`
	ChargesPerS float64            `json:"charges_per_s"`
	P50ms       float64            `json:"p50_ms"`
	CPUTicks    map[string]float64 `json:"cpu_ticks"`
	Events      *struct {
		P99ms float64 `json:"p99_ms"`
	} `json:"events"`
}

// pairParts are the keys of cpu_ticks in the table's order: the machine,
// the service, PostgreSQL, nats-server, the load generator.
var pairParts = []string{"machine", "service", "postgres", "nats-server", "paymentsbench"}

// tagLine puts the measurement's side, relay and round in front of the
// fields of paymentsbench's JSON line.
func tagLine(side, relay string, round int, line []byte) []byte {
	head := fmt.Sprintf(`{"side":%q,"relay":%q,"round":%d,`, side, relay, round)
	return append([]byte(head), bytes.TrimPrefix(line, []byte("{"))...)
}

// parsePairResults reads the JSON lines of a measurements file.
func parsePairResults(data []byte) ([]pairResult, error) {
	var out []pairResult
	for line := range bytes.Lines(data) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r pairResult
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("a measurement's line: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// cpuPerCharge is part's CPU time per charge in ms (ticks at tck a
// second); a part without ticks counts 0, a run without charges has none.
func (r pairResult) cpuPerCharge(part string, tck int) (float64, bool) {
	if r.Charges <= 0 || tck <= 0 {
		return 0, false
	}
	return 1000 * r.CPUTicks[part] / float64(tck) / r.Charges, true
}

// progressLine is the line a measurement prints on stderr.
func progressLine(r pairResult, tck int) string {
	machine := "–"
	if ms, ok := r.cpuPerCharge("machine", tck); ok {
		machine = number(roundTo(ms, 3))
	}
	return fmt.Sprintf("%s relay %s round %d: %s charges/s, p50 %s ms, machine %s ms/charge",
		r.Side, r.Relay, r.Round, number(r.ChargesPerS), number(r.P50ms), machine)
}

// pairHeader is what the table follows: pg-reference's medians.
func pairHeader(refTPS, refCPU string, clients, seconds int) string {
	return fmt.Sprintf("\npg-reference median: %s tps, machine CPU %s ms per transaction (%d clients, %d s)\n\n", refTPS, refCPU, clients, seconds) +
		"| side | relay | charges/s | × pg-reference | p50 ms | event p99 ms | CPU ms per charge: machine | service | postgres | nats-server | load generator |\n" +
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
}

// pairRow is the table's row of one side and relay: the medians over the
// rounds of charges/s (one decimal), its ratio to ref (pg-reference's
// median tps; two decimals), p50, the events' p99 (when every run timed
// them) and each part's CPU per charge (three decimals); a dash where
// there is no figure.
func pairRow(side, relay string, runs []pairResult, ref float64, tck int) string {
	pick := func(f func(pairResult) (float64, bool)) (float64, bool) {
		var xs []float64
		for _, r := range runs {
			if v, ok := f(r); ok {
				xs = append(xs, v)
			}
		}
		return benchrun.Median(xs)
	}
	cells := []string{side, relay}
	cps, ok := pick(func(r pairResult) (float64, bool) { return r.ChargesPerS, true })
	cps = roundTo(cps, 1)
	cells = append(cells, cell(cps, ok), cell(roundTo(cps/ref, 2), ok && ref > 0))
	p50, ok := pick(func(r pairResult) (float64, bool) { return r.P50ms, true })
	cells = append(cells, cell(roundTo(p50, 3), ok))
	p99, ok := pick(func(r pairResult) (float64, bool) {
		if r.Events == nil {
			return 0, false
		}
		return r.Events.P99ms, true
	})
	allTimed := !slices.ContainsFunc(runs, func(r pairResult) bool { return r.Events == nil })
	cells = append(cells, cell(roundTo(p99, 3), ok && allTimed))
	for _, part := range pairParts {
		ms, ok := pick(func(r pairResult) (float64, bool) { return r.cpuPerCharge(part, tck) })
		cells = append(cells, cell(roundTo(ms, 3), ok))
	}
	return "| " + strings.Join(cells, " | ") + " |\n"
}

// cell is v as number prints it, or a dash when there is no figure.
func cell(v float64, ok bool) string {
	if !ok {
		return "–"
	}
	return number(v)
}

// roundTo rounds v half away from zero to digits decimals.
func roundTo(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

// number prints v in the fewest digits that read back as v, without an
// exponent: 1783.3, 0.884, 1.
func number(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// textMedian is the median of numbers given as text, printed as the shell
// script's awk did: the middle one's text when they are odd in number,
// else the mean of the two in the middle in six significant digits (a whole
// number in full); "" when there are none.
func textMedian(texts []string) string {
	type value struct {
		text string
		v    float64
	}
	vs := make([]value, 0, len(texts))
	for _, t := range texts {
		v, _ := strconv.ParseFloat(t, 64)
		vs = append(vs, value{t, v})
	}
	slices.SortStableFunc(vs, func(a, b value) int { return cmp.Compare(a.v, b.v) })
	n := len(vs)
	switch {
	case n == 0:
		return ""
	case n%2 == 1:
		return vs[n/2].text
	}
	mean := (vs[n/2-1].v + vs[n/2].v) / 2
	if mean == math.Trunc(mean) && math.Abs(mean) < 1e15 {
		return strconv.FormatInt(int64(mean), 10)
	}
	return strconv.FormatFloat(mean, 'g', 6, 64)
}
