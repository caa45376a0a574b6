package main

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// ruleEvaluator evaluates the expressions of deploy/prometheus/alerts.yml
// with promtool, Prometheus's own PromQL engine, against what a process
// really exported.
type ruleEvaluator struct {
	promtool string // "" without promtool: nothing is evaluated
	rules    map[string]string
}

// newRuleEvaluator reads the alerting rules and finds promtool. Without it
// the evaluator evaluates nothing and says so once, as
// scripts/lint-alerts.sh does; under CI=true the test fails instead.
func newRuleEvaluator(t *testing.T) *ruleEvaluator {
	t.Helper()
	e := &ruleEvaluator{rules: map[string]string{}}
	for where, expr := range ruleQueries(t, alertsFile) {
		e.rules[strings.TrimPrefix(where, alertsFile+": ")] = expr
	}
	path, err := exec.LookPath("promtool")
	switch {
	case err == nil:
		e.promtool = path
	case os.Getenv("CI") == "true":
		t.Fatal("promtool not found, and CI=true: install it (apt-get install -y prometheus)")
	default:
		t.Log("promtool not found: the alerting rules' expressions are NOT evaluated (apt-get install -y prometheus)")
	}
	return e
}

// check fails the test unless the expression of the alerting rule named
// alert returns something (it would be pending, then firing) exactly when
// want is true, evaluated at the last of scrapes: each the text of one
// scrape of one target, in the order taken, and a minute apart on
// promtool's clock, so that a range of 15m spans the last 15 scrapes. Only
// the series the expression names are given to promtool, each with the
// target's labels job="payments", instance="serve".
func (e *ruleEvaluator) check(t *testing.T, alert string, scrapes []string, want bool) {
	t.Helper()
	expr, ok := e.rules[alert]
	if !ok {
		t.Fatalf("%s has no rule %s", alertsFile, alert)
	}
	if e.promtool == "" {
		return
	}
	names, err := promqlMetricNames(expr)
	if err != nil {
		t.Fatal(err)
	}
	series := scrapedSeries(scrapes, names)
	if len(series) == 0 {
		t.Fatalf("%s: none of %v is in the scrapes", alert, names)
	}
	expected := 0
	if want {
		expected = 1
	}
	rulesFile, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	type inputSeries struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type exprTest struct {
		Expr       string   `yaml:"expr"`
		EvalTime   string   `yaml:"eval_time"`
		ExpSamples []sample `yaml:"exp_samples"`
	}
	type unitTest struct {
		Interval       string        `yaml:"interval"`
		InputSeries    []inputSeries `yaml:"input_series"`
		PromQLExprTest []exprTest    `yaml:"promql_expr_test"`
	}
	// count(...) > bool 0: 1 if the expression returns anything, and 0
	// from vector(0) if it returns nothing.
	unit := unitTest{Interval: "1m", PromQLExprTest: []exprTest{{
		Expr:       "(count(" + expr + ") > bool 0) or vector(0)",
		EvalTime:   fmt.Sprintf("%dm", len(scrapes)-1),
		ExpSamples: []sample{{Labels: "{}", Value: float64(expected)}},
	}}}
	for _, name := range slices.Sorted(maps.Keys(series)) {
		unit.InputSeries = append(unit.InputSeries, inputSeries{name, strings.Join(series[name], " ")})
	}
	test := struct {
		RuleFiles          []string   `yaml:"rule_files"`
		EvaluationInterval string     `yaml:"evaluation_interval"`
		Tests              []unitTest `yaml:"tests"`
	}{[]string{rulesFile}, "1m", []unitTest{unit}}
	b, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rule_test.yml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(e.promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("%s's expression over %d scrapes: want it to hold %v; promtool: %v\n%s\ninput:\n%s", alert, len(scrapes), want, err, out, b)
	}
}

// sampleLine matches a sample of the Prometheus text format: its name, its
// labels if any, its value.
var sampleLine = regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)

// scrapedSeries returns, for every sample of the metrics named in names
// (a histogram's _bucket, _sum and _count under its name), its series as
// promtool's input_series spells it, with the target's labels, and its value
// in each scrape ("_" where a scrape lacks it).
func scrapedSeries(scrapes []string, names []string) map[string][]string {
	series := map[string][]string{}
	for i, text := range scrapes {
		for _, m := range sampleLine.FindAllStringSubmatch(text, -1) {
			family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m[1], "_bucket"), "_sum"), "_count")
			if !slices.Contains(names, m[1]) && !slices.Contains(names, family) {
				continue
			}
			labels := `job="payments",instance="serve"`
			if m[2] != "" && m[2] != "{}" {
				labels += "," + m[2][1:len(m[2])-1]
			}
			key := m[1] + "{" + labels + "}"
			if series[key] == nil {
				series[key] = slices.Repeat([]string{"_"}, len(scrapes))
			}
			series[key][i] = m[3]
		}
	}
	return series
}

// TestScrapedSeries: the series given to promtool are those the expression
// names (a histogram's by its name), with the target's labels and their own,
// a value per scrape, and "_" where a scrape lacks one.
func TestScrapedSeries(t *testing.T) {
	scrapes := []string{
		"# TYPE g gauge\ng 1\ngx 5\nh_bucket{le=\"0.5\"} 2\n",
		"g 2.5\nc_total{reason=\"send\"} 3\nh_bucket{le=\"0.5\"} 4\nh_count 4\n",
	}
	got := scrapedSeries(scrapes, []string{"g", "c_total", "h"})
	want := map[string][]string{
		`g{job="payments",instance="serve"}`:                     {"1", "2.5"},
		`c_total{job="payments",instance="serve",reason="send"}`: {"_", "3"},
		`h_bucket{job="payments",instance="serve",le="0.5"}`:     {"2", "4"},
		`h_count{job="payments",instance="serve"}`:               {"_", "4"},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("scrapedSeries = %q, want %q", got, want)
	}
}
