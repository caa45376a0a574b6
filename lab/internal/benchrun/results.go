package benchrun

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Run is one load-generator run: its JSON line (bin/paymentsbench -json),
// named by its tag in place of the scenario, and the machine's 1-minute load
// average when it ended.
type Run struct {
	Name   string
	Load   string
	fields map[string]json.RawMessage
}

// ParseRun reads one JSON line of paymentsbench.
func ParseRun(line []byte) (Run, error) {
	var r Run
	if err := json.Unmarshal(line, &r.fields); err != nil {
		return Run{}, err
	}
	r.Name = r.Text("scenario")
	return r, nil
}

// Text is the field as it stands in the JSON (a number's digits, true,
// false; a string without quotes), "" when absent.
func (r Run) Text(name string) string {
	raw, ok := r.fields[name]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// Float is the field as a number, ok false when absent or not a number.
func (r Run) Float(name string) (float64, bool) {
	v, err := strconv.ParseFloat(r.Text(name), 64)
	return v, err == nil
}

// Verified reports whether the run's balances matched.
func (r Run) Verified() bool { return r.Text("verified") == "true" }

// Counts is an object of counts (errors, held_key_statuses) as
// "402: 3, none: 1" in the JSON's order, "" when empty or absent.
func (r Run) Counts(name string) string {
	raw := bytes.TrimSpace(r.fields[name])
	if len(raw) < 2 || raw[0] != '{' {
		return ""
	}
	inner := strings.ReplaceAll(string(raw[1:len(raw)-1]), `"`, "")
	inner = strings.ReplaceAll(inner, ":", ": ")
	return strings.ReplaceAll(inner, ",", ", ")
}

// Errors is Counts("errors"), or "0" when there were none.
func (r Run) Errors() string {
	if e := r.Counts("errors"); e != "" {
		return e
	}
	return "0"
}

// CountMap is an object of counts as a map.
func (r Run) CountMap(name string) map[string]int64 {
	var m map[string]int64
	_ = json.Unmarshal(r.fields[name], &m)
	return m
}

// Raw is the field's JSON.
func (r Run) Raw(name string) string { return string(r.fields[name]) }

// Results holds the runs in the order they ran and appends each one's
// JSON line (renamed) to a file.
type Results struct {
	path string
	runs []Run
}

// NewResults starts the file at path empty.
func NewResults(path string) (*Results, error) {
	return &Results{path: path}, os.WriteFile(path, nil, 0o644)
}

// Add records a run and appends its line, with the scenario renamed to the
// run's name, to the file.
func (rs *Results) Add(r Run) error {
	r.fields["scenario"] = json.RawMessage(strconv.Quote(r.Name))
	line, err := json.Marshal(r.fields)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(rs.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	rs.runs = append(rs.runs, r)
	_, err = fmt.Fprintf(f, "%s\n", line)
	return err
}

// Get is the run named name; a Run without fields when there is none.
func (rs *Results) Get(name string) Run {
	for _, r := range rs.runs {
		if r.Name == name {
			return r
		}
	}
	return Run{Name: name}
}

// Has reports whether a run named name is there.
func (rs *Results) Has(name string) bool { return rs.Get(name).fields != nil }

// Match is every run whose name matches ^pattern$, in the order they ran.
func (rs *Results) Match(pattern string) []Run {
	return matching(rs.runs, pattern, func(r Run) string { return r.Name })
}

// matching is the items whose name matches ^pattern$, in order.
func matching[T any](items []T, pattern string, name func(T) string) []T {
	re := regexp.MustCompile("^(?:" + pattern + ")$")
	var out []T
	for _, item := range items {
		if re.MatchString(name(item)) {
			out = append(out, item)
		}
	}
	return out
}

// Floats is field name of each run in runs that has it.
func Floats(runs []Run, name string) []float64 {
	var out []float64
	for _, r := range runs {
		if v, ok := r.Float(name); ok {
			out = append(out, v)
		}
	}
	return out
}
