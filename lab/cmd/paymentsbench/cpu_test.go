package main

import (
	"maps"
	"os"
	"testing"
	"time"
)

func TestCPUBetweenCountsByProcess(t *testing.T) {
	self := os.Getpid()
	a := cpuSample{machine: 1000, procs: map[int]procTicks{
		10: {"postgres", 50}, 11: {"postgres", 7}, 12: {"nats-server", 30},
		20: {"payments", 100}, self: {"paymentsbench", 40},
		30: {"postgres", 90}, // ends before b
		40: {"bash", 5},      // its pid is reused by a postgres backend
	}}
	b := cpuSample{machine: 1600, procs: map[int]procTicks{
		10: {"postgres", 80}, 11: {"postgres", 7}, 12: {"nats-server", 45},
		20: {"payments", 300}, self: {"paymentsbench", 100},
		40: {"postgres", 3}, // new
		41: {"postgres", 9}, // new
		50: {"chromium", 70},
	}}
	got := cpuBetween(a, b, 20, 0)
	want := map[string]int64{"machine": 600, "service": 200, "paymentsbench": 60, "postgres": 30 + 0 + 3 + 9, "nats-server": 15}
	if !maps.Equal(got, want) {
		t.Errorf("cpuBetween = %v, want %v", got, want)
	}
	a.procs[60], b.procs[60] = procTicks{"procsim", 10}, procTicks{"procsim", 35}
	got = cpuBetween(a, b, 20, 60)
	want["processor"] = 25
	if !maps.Equal(got, want) {
		t.Errorf("cpuBetween with the processor = %v, want %v", got, want)
	}
}

var sink int

func TestSampleCPUFindsThisProcess(t *testing.T) {
	s, err := sampleCPU()
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	p, ok := s.procs[os.Getpid()]
	if !ok || p.name == "" || p.ticks < 0 || s.machine <= 0 {
		t.Errorf("sampleCPU: this process %+v (found %v), machine %d ticks", p, ok, s.machine)
	}
	// Burn 100 ms of CPU: the machine's count (10 ms ticks) moves.
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		sink++
	}
	s2, err := sampleCPU()
	if err != nil {
		t.Fatal(err)
	}
	if d := cpuBetween(s, s2, 0, 0); d["machine"] <= 0 || d["paymentsbench"] < 0 {
		t.Errorf("after burning CPU: %v, want the machine's ticks to grow", d)
	}
}
