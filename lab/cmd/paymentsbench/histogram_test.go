package main

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsTileTheValues(t *testing.T) {
	t.Parallel()
	// Every value falls in the bucket whose range holds it, and consecutive
	// buckets leave no gap and do not overlap.
	var next uint64
	for i := range numBuckets {
		lo, hi := bucketRange(i)
		if lo != next || hi < lo {
			t.Fatalf("bucket %d = [%d, %d], want it to start at %d", i, lo, hi, next)
		}
		for _, v := range []uint64{lo, hi, lo + (hi-lo)/2} {
			if got := bucketOf(v); got != i {
				t.Fatalf("bucketOf(%d) = %d, want %d", v, got, i)
			}
		}
		if i < 1<<subBits {
			if hi != lo {
				t.Fatalf("bucket %d is %d wide, want exact", i, hi-lo+1)
			}
		} else if width := hi - lo + 1; width*subHalf > lo {
			t.Fatalf("bucket %d = [%d, %d]: width %d exceeds 1/%d of its values", i, lo, hi, width, subHalf)
		}
		next = hi + 1
	}
	if next != 0 { // wrapped past the largest uint64
		t.Fatalf("buckets end at %d, want them to cover every uint64", next)
	}
}

func TestQuantile(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name    string
		samples []time.Duration
		q       float64
		want    time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one sample", []time.Duration{7 * ms}, 0.99, 7 * ms},
		{"exact below 256ns", []time.Duration{10, 20, 30, 40}, 0.5, 20},
		{"p100 is the max", []time.Duration{ms, 2 * ms, 3 * ms}, 1, 3 * ms},
		{"p0 is the min bucket", []time.Duration{100, 200, 300}, 0, 100},
		{"never above max", []time.Duration{ms + 1, ms + 1}, 0.5, ms + 1},
		{"negative counts as zero", []time.Duration{-5, 1, 2}, 0.1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var h histogram
			for _, s := range tt.samples {
				h.record(s)
			}
			if got := h.quantile(tt.q); got != tt.want {
				t.Errorf("quantile(%g) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

// TestQuantileMatchesSortedSamples compares the histogram with exact
// percentiles of the same samples: never below, and at most 1/128 above.
func TestQuantileMatchesSortedSamples(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	samples := make([]time.Duration, 100_000)
	var h histogram
	for i := range samples {
		// Log-normal-ish latencies from about 50µs to a few seconds.
		samples[i] = time.Duration(50_000 * (1 + r.ExpFloat64()*r.ExpFloat64()*200))
		h.record(samples[i])
	}
	slices.Sort(samples)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 1} {
		rank := int(float64(len(samples))*q+0.999999) - 1
		exact := samples[max(rank, 0)]
		got := h.quantile(q)
		if got < exact || float64(got-exact) > float64(exact)/subHalf {
			t.Errorf("quantile(%g) = %v, exact %v: off by more than 1/%d", q, got, exact, subHalf)
		}
	}
	if h.max != samples[len(samples)-1] || h.min != samples[0] {
		t.Errorf("min, max = %v, %v, want %v, %v", h.min, h.max, samples[0], samples[len(samples)-1])
	}
}

func TestMerge(t *testing.T) {
	t.Parallel()
	var all, a, b, empty histogram
	for i := range 1000 {
		d := time.Duration(i*i) * time.Microsecond
		all.record(d)
		if i%3 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
	}
	a.merge(&b)
	a.merge(&empty)
	if a != all {
		t.Errorf("merged histogram differs from one that recorded every sample: n %d vs %d, min %v vs %v, max %v vs %v, mean %v vs %v",
			a.n, all.n, a.min, all.min, a.max, all.max, a.mean(), all.mean())
	}
	empty.merge(&all)
	if empty.quantile(0.5) != all.quantile(0.5) || empty.min != all.min {
		t.Errorf("merging into an empty histogram lost its minimum or samples")
	}
}
