package main

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-linear, like HdrHistogram: durations below 2^subBits
// nanoseconds get a bucket each, and every power of two above is split into
// 2^(subBits-1) equal buckets. A bucket's width is therefore at most 1/128 of
// the values it holds, which bounds the error of any percentile, for a fixed
// 58 KiB per histogram however many samples it counts.
const (
	subBits    = 8
	subHalf    = 1 << (subBits - 1)
	numBuckets = (64-subBits)*subHalf + 1<<subBits
)

// histogram counts request latencies. The zero value is empty and ready; it is
// not safe for concurrent use (each client keeps its own, merged at the end).
type histogram struct {
	counts   [numBuckets]uint64
	n        uint64
	sum      time.Duration
	min, max time.Duration
}

// bucketOf returns the index of the bucket holding v.
func bucketOf(v uint64) int {
	if v < 1<<subBits {
		return int(v)
	}
	shift := bits.Len64(v) - subBits
	return shift*subHalf + int(v>>shift)
}

// bucketRange returns the smallest and the largest value bucket i holds.
func bucketRange(i int) (lo, hi uint64) {
	if i < 1<<subBits {
		return uint64(i), uint64(i)
	}
	shift := i/subHalf - 1
	lo = uint64(i-shift*subHalf) << shift
	return lo, lo + 1<<shift - 1
}

// record counts one latency; a negative one counts as zero.
func (h *histogram) record(d time.Duration) {
	d = max(d, 0)
	h.counts[bucketOf(uint64(d))]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	h.max = max(h.max, d)
	h.n++
	h.sum += d
}

// merge adds every sample of o to h.
func (h *histogram) merge(o *histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// quantile returns the latency at or below which a share q (0..1) of the
// samples fall: the largest value of the bucket holding the sample of rank
// ceil(q·n), never above the largest sample. It is 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			_, hi := bucketRange(i)
			return min(time.Duration(hi), h.max)
		}
	}
	return h.max
}

// mean returns the average latency, 0 for an empty histogram.
func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}
