package main

import (
	"io"
	"os"
	"strconv"
	"testing"
	"time"
)

func TestServicePIDReportsCPU(t *testing.T) {
	t.Parallel()
	pid := os.Getpid()
	if _, err := processCPUTicks(pid); err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	// The fake service runs in this test's process, which stands in for the service.
	results, err := bench(t, newFakeService(t, &fakeService{}), "-n", "200", "-scenarios", "fresh",
		"-service-pid", strconv.Itoa(pid))
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if c := results["fresh"].ServiceCPUTicks; c == nil || *c < 0 {
		t.Errorf("service_cpu_ticks = %v, want a count of ticks", c)
	}
	results, err = bench(t, newFakeService(t, &fakeService{}), "-n", "10", "-scenarios", "fresh")
	if err != nil || results["fresh"].ServiceCPUTicks != nil {
		t.Errorf("without -service-pid: service_cpu_ticks %v (%v), want none", results["fresh"].ServiceCPUTicks, err)
	}
}

func TestHeldKeyClientIsCountedApart(t *testing.T) {
	t.Parallel()
	f := &fakeService{heldKey: "held-1"}
	results, err := bench(t, newFakeService(t, f), "-d", "200ms", "-scenarios", "fresh", "-held-key", "held-1")
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	r := results["fresh"]
	if !r.Verified || r.InUse != 0 || int64(r.Keys) != r.Requests {
		t.Errorf("fresh with a held key: verified %t, %d in use, %d keys for %d requests; want the held key kept out of the figures",
			r.Verified, r.InUse, r.Keys, r.Requests)
	}
	if n := r.HeldKeyStatuses["409"]; n < int64(200*time.Millisecond/heldKeyPause)/4 || len(r.HeldKeyStatuses) != 1 {
		t.Errorf("held key answers %v; want only 409s, about one every %s", r.HeldKeyStatuses, heldKeyPause)
	}
}

func TestHeldKeyFlag(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"has space", string(make([]byte, 256))} {
		if _, err := parseConfig([]string{"-held-key", key}, func(string) string { return "sk" }, io.Discard); err == nil {
			t.Errorf("-held-key %.20q: no error", key)
		}
	}
}
