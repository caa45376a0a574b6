package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// pgbenchWindow is the steady part of a pg-reference run, without its
// scratch database's setup: the machine's busy clock ticks and the
// milliseconds between the first and the last look (every 0.2 s) that
// found its pgbench running.
type pgbenchWindow struct {
	Ticks, Ms int64
}

// watchPgbench looks for a pgbench under the process root every 0.2 s
// until done is closed, and returns the window it saw (zero when none).
func watchPgbench(root int, done <-chan struct{}) pgbenchWindow {
	var first, last struct{ ticks, ms int64 }
	seen := false
	for {
		if pgbenchUnder(root) {
			if ticks, err := busyTicks(); err == nil {
				last.ticks, last.ms = ticks, time.Now().UnixMilli()
				if !seen {
					first, seen = last, true
				}
			}
		}
		select {
		case <-done:
			return pgbenchWindow{Ticks: last.ticks - first.ticks, Ms: last.ms - first.ms}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// cpuPerTransaction is the machine's CPU time in ms per transaction over a
// window, at tps transactions a second and tck clock ticks a second; 0
// when the window or tps is empty.
func cpuPerTransaction(w pgbenchWindow, tps float64, tck int) float64 {
	if w.Ms <= 0 || tps <= 0 || tck <= 0 {
		return 0
	}
	return 1000 * float64(w.Ticks) / float64(tck) / (tps * float64(w.Ms) / 1000)
}

// busyTicks is the machine's CPU time so far, every CPU, in clock ticks.
func busyTicks() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseBusyTicks(string(b))
}

// parseBusyTicks reads the first line of /proc/stat ("cpu user nice
// system idle iowait irq softirq steal guest guest_nice") and counts all
// but idle and iowait; guest time is in user already.
func parseBusyTicks(stat string) (int64, error) {
	line, _, _ := strings.Cut(stat, "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += n
	}
	return busy, nil
}

// proc is a process as /proc/PID/stat describes it.
type proc struct {
	comm string
	ppid int
}

// parseProcStat reads the name and the parent of /proc/PID/stat's line
// "PID (COMM) STATE PPID ...", where COMM may hold spaces and parentheses.
func parseProcStat(line string) (proc, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return proc{}, errors.New("no (comm)")
	}
	rest := strings.Fields(line[end+1:])
	if len(rest) < 2 {
		return proc{}, errors.New("no parent")
	}
	ppid, err := strconv.Atoi(rest[1])
	if err != nil {
		return proc{}, err
	}
	return proc{comm: line[open+1 : end], ppid: ppid}, nil
}

// processes is every process of the machine by pid.
func processes() map[int]proc {
	entries, _ := os.ReadDir("/proc")
	out := make(map[int]proc, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // it ended meanwhile
		}
		if p, err := parseProcStat(string(b)); err == nil {
			out[pid] = p
		}
	}
	return out
}

// pgbenchUnder reports whether a process named pgbench descends from root
// (pg-reference runs it in a subshell): another pgbench on the machine,
// another run's, does not count.
func pgbenchUnder(root int) bool {
	procs := processes()
	for pid, p := range procs {
		if p.comm == "pgbench" && descends(procs, pid, root) {
			return true
		}
	}
	return false
}

// descends reports whether pid is root or one of its descendants in procs.
func descends(procs map[int]proc, pid, root int) bool {
	for range 64 { // deeper than any chain of shells
		if pid == root {
			return true
		}
		p, ok := procs[pid]
		if !ok || p.ppid == 0 {
			return false
		}
		pid = p.ppid
	}
	return false
}
