package procsim

import (
	"math/rand/v2"
	"sync"
)

// faults draws the random faults of the chaos mode from a seeded generator,
// so a run can be repeated: with probability rate a request gets one of
// randomFaults, each as likely as the others.
type faults struct {
	rate float64
	mu   sync.Mutex
	rng  *rand.Rand
}

var randomFaults = []Fault{FaultLoseResponse, Fault5xxBefore, Fault5xxAfter, FaultSlow}

func newFaults(rate float64, seed uint64) *faults {
	//nolint:gosec // G404: fault injection wants a repeatable sequence, not secrecy
	return &faults{rate: rate, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// draw returns the fault for one request; FaultNone when the mode is off.
func (f *faults) draw() Fault {
	if f.rate == 0 {
		return FaultNone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.Float64() >= f.rate {
		return FaultNone
	}
	return randomFaults[f.rng.IntN(len(randomFaults))]
}
