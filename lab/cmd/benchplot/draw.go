package main

import (
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// palette colours the series in order: blue, orange, green, red.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// drawChart writes a PNG chart of value against clients, one line with points per
// series. Clients go on a base-2 logarithmic axis, ticked at each measured
// count; the value axis starts at zero.
func drawChart(path, title, ylabel string, series []series, value func(point) float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "concurrent clients"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = clientTicks(series)
	p.Y.Min = 0
	p.Y.Tick.Marker = niceTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8) // clear of the value axis
	p.Add(plotter.NewGrid())
	for i, s := range series {
		xys := make(plotter.XYs, len(s.points))
		for j, pt := range s.points {
			xys[j] = plotter.XY{X: float64(pt.clients), Y: value(pt)}
			p.Y.Max = max(p.Y.Max, xys[j].Y)
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		c := palette[i%len(palette)]
		line.Color = c
		line.Width = vg.Points(1.5)
		points.Color = c
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2.5)
		p.Add(line, points)
		p.Legend.Add(s.name, line, points)
	}
	// Headroom above the highest point, for the legend.
	p.Y.Max *= 1.15
	if p.Y.Max == 0 {
		p.Y.Max = 1
	}
	return p.Save(20*vg.Centimeter, 12*vg.Centimeter, path)
}

// niceTicks marks four to eight round values (1, 2 or 5 times a power of ten)
// between min and max, labelled without needless decimals.
type niceTicks struct{}

// Ticks implements plot.Ticker.
func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	if hi <= lo {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'f', -1, 64)}}
	}
	// The smallest round step at least 0.7 of a fifth of the range.
	raw := 0.7 * (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{2, 5, 10} {
		if step >= raw {
			break
		}
		step = m * mag
	}
	decimals := max(0, -int(math.Floor(math.Log10(step))))
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
	}
	return ticks
}

// clientTicks marks every client count that some series measured.
func clientTicks(series []series) plot.Ticker {
	seen := map[int]bool{}
	var ticks plot.ConstantTicks
	for _, s := range series {
		for _, pt := range s.points {
			if !seen[pt.clients] {
				seen[pt.clients] = true
				ticks = append(ticks, plot.Tick{Value: float64(pt.clients), Label: strconv.Itoa(pt.clients)})
			}
		}
	}
	return ticks
}
