package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlWords are PromQL's aggregation operators and keywords: identifiers
// that never name a series. (Functions are told apart by the parenthesis
// after them.)
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// promqlLabelLists are the keywords a parenthesised list of label names may
// follow.
var promqlLabelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// promqlMetricNames returns, sorted and once each, the metric names a PromQL
// expression selects: the identifiers that are neither functions (followed by
// "("), aggregations nor keywords, outside strings, label matchers ({...}),
// ranges ([...]), label lists (by (...)), comments and Grafana variables
// ($name, ${name}). It is a tokenizer, not a parser: it reads the expressions
// of deploy/, and an unbalanced bracket or string is an error rather than a
// silent miss.
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := promqlSkipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{' || c == '[':
			end, err := promqlSkipGroup(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '$':
			i++
			if i < len(expr) && expr[i] == '{' {
				end, err := promqlSkipGroup(expr, i)
				if err != nil {
					return nil, err
				}
				i = end
			}
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
		case isDigit(c) || c == '.' && i+1 < len(expr) && isDigit(expr[i+1]):
			i = promqlSkipNumber(expr, i)
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := i
			for next < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[next])) {
				next++
			}
			paren := next < len(expr) && expr[next] == '('
			switch lower := strings.ToLower(word); {
			case promqlLabelLists[lower] && paren:
				end, err := promqlSkipGroup(expr, next)
				if err != nil {
					return nil, err
				}
				i = end
			case promqlWords[lower], paren:
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
		default:
			i++
		}
	}
	slices.Sort(names)
	return names, nil
}

// promqlSkipGroup returns the index after the bracket that closes the one
// at expr[open] ({, [ or (), skipping strings inside.
func promqlSkipGroup(expr string, open int) (int, error) {
	closing := map[byte]byte{'{': '}', '[': ']', '(': ')'}[expr[open]]
	depth := 0
	for i := open; i < len(expr); {
		switch expr[i] {
		case '"', '\'', '`':
			end, err := promqlSkipString(expr, i)
			if err != nil {
				return 0, err
			}
			i = end
			continue
		case expr[open]:
			depth++
		case closing:
			depth--
			if depth == 0 {
				return i + 1, nil
			}
		}
		i++
	}
	return 0, fmt.Errorf("unclosed %q at offset %d of %q", expr[open], open, expr)
}

// promqlSkipString returns the index after the string starting at
// expr[open]; backslashes escape in "..." and '...', not in `...`.
func promqlSkipString(expr string, open int) (int, error) {
	quote := expr[open]
	for i := open + 1; i < len(expr); i++ {
		switch {
		case expr[i] == '\\' && quote != '`':
			i++
		case expr[i] == quote:
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed string at offset %d of %q", open, expr)
}

// promqlSkipNumber returns the index after the number or duration at
// expr[start]: 0.99, 1e-3, 0x1f, 5m, 1h30m.
func promqlSkipNumber(expr string, start int) int {
	i := start
	for i < len(expr) {
		c := expr[i]
		switch {
		case isIdentChar(c) || c == '.':
			i++
		case (c == '+' || c == '-') && (expr[i-1] == 'e' || expr[i-1] == 'E') && !strings.HasPrefix(expr[start:], "0x"):
			i++
		default:
			return i
		}
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}
func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) }

// TestPromQLMetricNames: the tokenizer that the metric-name check rests on
// finds the series of every construct deploy/ uses, and none of the
// functions, keywords, label names, strings, durations or variables around
// them.
func TestPromQLMetricNames(t *testing.T) {
	cases := []struct {
		expr string
		want []string
	}{
		{`up == 0`, []string{"up"}},
		{`absent(up{job="payments"} == 1)`, []string{"up"}},
		{`sum(payments_relay_leader) == 0 or absent(payments_relay_leader)`, []string{"payments_relay_leader"}},
		{`sum by (route, method) (rate(a_count{status=~"5..", route!="/v1/x/{id}"}[5m]))`, []string{"a_count"}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket{instance=~"$instance"}[$__rate_interval])))`, []string{"h_bucket"}},
		{"max by (instance) (acquired / max_conns) >= 0.9", []string{"acquired", "max_conns"}},
		{`a * on(instance) group_left(version) b`, []string{"a", "b"}},
		{`a * ignoring (reason) group_right b`, []string{"a", "b"}},
		{`time() - max(caught_up) > 900`, []string{"caught_up"}},
		{`sum(rate(x[5m] offset 1h)) > bool 0`, []string{"x"}},
		{`sum(rate(x[1h30m:1m])) by (job)`, []string{"x"}},
		{`sum without (instance) (rate(x[${__rate_interval}])) / ignoring(reason) y`, []string{"x", "y"}},
		{`count_values("version", build_info)`, []string{"build_info"}},
		{`topk(5, x) or quantile(0.9, y) or bottomk(1e-3, z)`, []string{"x", "y", "z"}},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []string{"m"}},
		{"# a comment naming not_a_metric\nbar # and another", []string{"bar"}},
		{`x > Inf or y < -NaN unless z`, []string{"x", "y", "z"}},
		{`job:requests:rate5m > 2.5e+3`, []string{"job:requests:rate5m"}},
		{`c >= d and c > 0`, []string{"c", "d"}},
		{`rate(x{a="b\"}c", d='e}\'f', g=` + "`h}`" + `}[5m])`, []string{"x"}},
		{"SUM BY (le) (rate(x_bucket[5m]))", []string{"x_bucket"}},
		{`vector(1)`, nil},
	}
	for _, tc := range cases {
		got, err := promqlMetricNames(tc.expr)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("promqlMetricNames(%q) = %q, %v; want %q", tc.expr, got, err, tc.want)
		}
	}
	for _, bad := range []string{`sum(x{a="b"`, `x{a="b}`, `rate(x[5m)`, `x{a='b`} {
		if got, err := promqlMetricNames(bad); err == nil {
			t.Errorf("promqlMetricNames(%q) = %q, want an error", bad, got)
		}
	}
}
