package benchrun

import (
	"math"
	"slices"
	"strconv"
)

// Median of xs; ok false when there are none.
func Median(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2], true
	}
	return (s[n/2-1] + s[n/2]) / 2, true
}

// Mean of xs; ok false when there are none.
func Mean(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs)), true
}

// Sum of xs.
func Sum(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum
}

// Percentiles are the nearest-rank quantiles qs (0..1) of xs, three
// decimals each; "?" for each when there are none.
func Percentiles(xs []float64, qs ...float64) []string {
	s := slices.Sorted(slices.Values(xs))
	out := make([]string, len(qs))
	for i, q := range qs {
		if len(s) == 0 {
			out[i] = "?"
			continue
		}
		k := max(int(math.Ceil(q*float64(len(s)))), 1)
		out[i] = Fixed(s[k-1], 3)
	}
	return out
}

// Fixed formats v with digits decimals.
func Fixed(v float64, digits int) string { return strconv.FormatFloat(v, 'f', digits, 64) }

// FixedOr is Fixed, or "" when ok is false: Fixed(Median(xs)) in one call.
func FixedOr(v float64, ok bool, digits int) string {
	if !ok {
		return ""
	}
	return Fixed(v, digits)
}

// Num parses a figure as the report holds it; ok false when empty or "?".
func Num(s string) (float64, bool) {
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// Ratio is a / b with digits decimals, "n/a" when either is missing or b
// is not positive.
func Ratio(a, b string, digits int) string {
	x, okA := Num(a)
	y, okB := Num(b)
	if !okA || !okB || y <= 0 {
		return "n/a"
	}
	return Fixed(x/y, digits)
}

// AtLeast is the verdict of value ≥ target; AtMost of value ≤ target. A
// missing value counts as 0, as awk would.
func AtLeast(value string, target float64) string {
	v, _ := Num(value)
	return verdict(v >= target)
}

// AtMost is the verdict of value ≤ target.
func AtMost(value string, target float64) string {
	v, _ := Num(value)
	return verdict(v <= target)
}

func verdict(met bool) string {
	if met {
		return "**met**"
	}
	return "**not met**"
}

// OrDash is s, or an em dash when s is empty.
func OrDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// MiB is bytes in MiB, one decimal.
func MiB(bytes float64) string { return Fixed(bytes/1048576, 1) }
