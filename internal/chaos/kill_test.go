package chaos_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// How the failover scenarios find and kill a member's server: its processes
// by their working directory, each told apart from a later process that
// reuses its pid.

// proc is one process, told apart from a later one that reuses its pid by
// its start time.
type proc struct {
	pid   int
	start string // field 22 of /proc/<pid>/stat, in clock ticks after boot
}

// stat returns a process's state letter and start time from /proc/<pid>/stat.
func stat(pid int) (state, start string, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", err
	}
	// pid (comm) state ppid ...; comm may hold spaces, so read after ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 {
		return "", "", fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	return f[0], f[19], nil
}

// procOf returns the running process pid.
func procOf(pid int) (proc, error) {
	_, start, err := stat(pid)
	if err != nil {
		return proc{}, err
	}
	return proc{pid: pid, start: start}, nil
}

// running reports whether p has not exited (a zombie has).
func (p proc) running() bool {
	state, start, err := stat(p.pid)
	return err == nil && start == p.start && state != "Z" && state != "X"
}

// processes returns every running process of the server whose data
// directory is dataDir: PostgreSQL's postmaster changes into its data
// directory, and every process it starts inherits that (backends,
// walsenders, the startup process and walreceiver, the checkpointer...),
// also once orphaned by its postmaster's death. Reading another user's
// /proc/<pid>/cwd takes root or that user: killServer checks that the
// postmaster is among them.
func processes(dataDir string) []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err != nil || cwd != dataDir {
			continue
		}
		if p, err := procOf(pid); err == nil && p.running() {
			out = append(out, p)
		}
	}
	return out
}

// signalAll sends sig to every process of procs that still runs.
func signalAll(procs []proc, sig syscall.Signal) error {
	for _, p := range procs {
		if !p.running() {
			continue
		}
		if err := syscall.Kill(p.pid, sig); err != nil && err != syscall.ESRCH {
			return err
		}
	}
	return nil
}

// stillThere returns errMoved when srv's postmaster is no longer the one
// settle saw running: the member restarted (a demotion restarts it) or died.
func stillThere(srv server) error {
	if !srv.postmaster.running() {
		return fmt.Errorf("%w: %s's postmaster (pid %d) is gone", errMoved, srv.Name, srv.postmaster.pid)
	}
	return nil
}

// killServer sends SIGKILL to srv's postmaster, or with all to every process
// of srv, and returns once every process of srv is gone: kill(2) returns
// before the kernel has ended the postmaster, and its backends and walsender
// go on serving (committing, acknowledging) until each notices that death;
// until then the fault has not happened. It returns how long that took, and
// fails when a process outlives the signal by 30 s.
func killServer(srv server, all bool) (time.Duration, error) {
	procs := processes(srv.dataDir)
	if !slices.Contains(procs, srv.postmaster) {
		return 0, fmt.Errorf("%s's postmaster (pid %d) is not among the processes working in %s that this test can see (it needs root or the postgres user)",
			srv.Name, srv.postmaster.pid, srv.dataDir)
	}
	sent := time.Now()
	var err error
	if all {
		err = signalAll(procs, syscall.SIGKILL)
	} else {
		err = signalAll([]proc{srv.postmaster}, syscall.SIGKILL)
	}
	if err != nil {
		return 0, fmt.Errorf("SIGKILL %s: %w", srv.Name, err)
	}
	// Listed again now that the postmaster can start no other process: one
	// forked since the first listing is waited for too.
	procs = append(procs, processes(srv.dataDir)...)
	return waitGone(srv.Name, procs, sent, 30*time.Second)
}

// waitGone waits until every process of procs has exited, polling every
// millisecond, and returns the time since sent.
func waitGone(name string, procs []proc, sent time.Time, bound time.Duration) (time.Duration, error) {
	for {
		left := slices.DeleteFunc(slices.Clone(procs), func(p proc) bool { return !p.running() })
		if len(left) == 0 {
			return time.Since(sent), nil
		}
		if time.Since(sent) > bound {
			return 0, fmt.Errorf("%d processes of %s still run %v after SIGKILL: %v", len(left), name, bound, left)
		}
		time.Sleep(time.Millisecond)
	}
}
