// Command benchplot draws the throughput curve of `make bench`: charges/s and
// p99 latency against the number of concurrent clients, one line per series
// (the service, pg-reference), as two PNGs.
//
//	go -C lab run ./cmd/benchplot -in ../bin/bench-curve.tsv -throughput ../docs/bench-throughput.png -p99 ../docs/bench-p99.png
//
// (from the repository's root). The input is what `make bench`
// (lab/cmd/benchrun) writes: one measurement per line, fields
// separated by tabs or spaces,
//
//	series  clients  charges_per_s  p99_ms
//
// Lines starting with # and blank lines are skipped. Series appear in the
// legend in the order they first appear in the file.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

// run reads the measurements and writes both charts.
func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchplot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "", "the measurements: series clients charges_per_s p99_ms per line")
	throughput := fs.String("throughput", "bench-throughput.png", "PNG of charges/s against clients")
	p99 := fs.String("p99", "bench-p99.png", "PNG of p99 latency against clients")
	title := fs.String("title", "", "a line added under each chart's title (for example the machine and date)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || fs.NArg() > 0 {
		return errors.New("usage: benchplot -in FILE [-throughput PNG] [-p99 PNG] [-title TEXT]")
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	series, err := parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	charts := []struct {
		path, title, ylabel string
		value               func(point) float64
	}{
		{*throughput, "Fresh charges per second", "charges/s", func(p point) float64 { return p.chargesPerSec }},
		{*p99, "Fresh charge latency, p99", "p99 latency (ms)", func(p point) float64 { return p.p99ms }},
	}
	for _, c := range charts {
		t := c.title
		if *title != "" {
			t += "\n" + *title
		}
		if err := drawChart(c.path, t, c.ylabel, series, c.value); err != nil {
			return fmt.Errorf("%s: %w", c.path, err)
		}
	}
	return nil
}

// point is one measurement of a series.
type point struct {
	clients       int
	chargesPerSec float64
	p99ms         float64
}

// series is one line of a chart: its points by ascending clients.
type series struct {
	name   string
	points []point
}

// parse reads the measurements. A malformed line is an error naming it.
func parse(r io.Reader) ([]series, error) {
	var (
		out   []series
		index = map[string]int{}
		sc    = bufio.NewScanner(r)
		n     int
	)
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("line %d: want 4 fields (series clients charges_per_s p99_ms), got %d", n, len(f))
		}
		clients, err := strconv.Atoi(f[1])
		if err != nil || clients < 1 {
			return nil, fmt.Errorf("line %d: clients: want a positive whole number, got %q", n, f[1])
		}
		var v [2]float64
		for i, s := range f[2:] {
			if v[i], err = strconv.ParseFloat(s, 64); err != nil || v[i] < 0 {
				return nil, fmt.Errorf("line %d: want a non-negative number, got %q", n, s)
			}
		}
		i, ok := index[f[0]]
		if !ok {
			i = len(out)
			index[f[0]] = i
			out = append(out, series{name: f[0]})
		}
		out[i].points = append(out[i].points, point{clients: clients, chargesPerSec: v[0], p99ms: v[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no measurements")
	}
	for _, s := range out {
		sort.SliceStable(s.points, func(a, b int) bool { return s.points[a].clients < s.points[b].clients })
	}
	return out, nil
}
