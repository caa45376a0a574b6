package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// cpuNames are the programs whose CPU time -cpu reports apart, by command
// name: the database and the broker a charge's event goes to. The service
// is found by -service-pid, and this process is paymentsbench.
var cpuNames = []string{"postgres", "nats-server"}

// cpuSample is the CPU time used so far on this machine: by all its CPUs
// (busy: neither idle nor waiting for I/O) and by every process alive now,
// in clock ticks.
type cpuSample struct {
	machine int64
	procs   map[int]procTicks
}

type procTicks struct {
	name  string
	ticks int64
}

// sampleCPU reads /proc/stat and every /proc/PID/stat.
func sampleCPU() (cpuSample, error) {
	s := cpuSample{procs: make(map[int]procTicks)}
	var err error
	if s.machine, err = machineBusyTicks(); err != nil {
		return s, err
	}
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return s, err
	}
	for _, path := range dirs {
		b, err := os.ReadFile(path) //nolint:gosec // a /proc/PID/stat path from the Glob above
		if err != nil {
			continue // ended meanwhile
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		stat := string(b)
		name := ""
		if i, j := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')'); i >= 0 && j > i {
			name = stat[i+1 : j]
		}
		ticks, err := benchrun.ParseCPUTicks(stat)
		if err != nil {
			continue
		}
		s.procs[pid] = procTicks{name, ticks}
	}
	return s, nil
}

// machineBusyTicks sums the first line of /proc/stat (all CPUs) but for
// idle and iowait.
func machineBusyTicks() (int64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, fmt.Errorf("/proc/stat: empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", sc.Text())
	}
	var busy int64
	for i, v := range fields[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is in user already
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q: %w", v, err)
		}
		busy += n
	}
	return busy, nil
}

// cpuBetween is the CPU time spent between two samples: by the machine, by
// the service (pid service), by the card processor (pid processor, when not
// 0), by this process, and by the processes named in cpuNames, summed over
// those alive at the end (one started meanwhile counts whole; one that ended
// meanwhile is missed, so PostgreSQL's share is a floor when backends come
// and go; the service's pool keeps its own).
func cpuBetween(a, b cpuSample, service, processor int) map[string]int64 {
	out := map[string]int64{"machine": b.machine - a.machine}
	if processor > 0 {
		out["processor"] = 0
	}
	self := os.Getpid()
	for pid, p := range b.procs {
		d := p.ticks - a.procs[pid].ticks
		if a.procs[pid].name != p.name {
			d = p.ticks // a new process under a reused pid
		}
		switch pid {
		case service:
			out["service"] += d
		case processor:
			out["processor"] += d
		case self:
			out["paymentsbench"] += d
		default:
			for _, n := range cpuNames {
				if p.name == n {
					out[n] += d
				}
			}
		}
	}
	return out
}
