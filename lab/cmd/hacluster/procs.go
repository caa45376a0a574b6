package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// parsePid reads a pid from the start of a pid file. It accepts only
// positive pids: kill(0) and kill(-1) signal whole groups.
func parsePid(data []byte) (int, bool) {
	first, _, _ := bytes.Cut(data, []byte("\n"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(first)))
	return pid, err == nil && pid > 0
}

// cmdline is the process's command line, arguments separated by spaces
// ("" when it has gone or is a zombie).
func cmdline(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)) //nolint:gosec // G703: the path of an integer pid
	if err != nil {
		return ""
	}
	return joinCmdline(raw)
}

// joinCmdline turns /proc/PID/cmdline's NUL-separated arguments into one
// line.
func joinCmdline(raw []byte) string {
	return string(bytes.ReplaceAll(raw, []byte{0}, []byte{' '}))
}

// runs reports whether pid is a live process: signal 0 reaches it and it is
// not a zombie, which has exited and waits only to be reaped.
func runs(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)) //nolint:gosec // G703: the path of an integer pid
	if err != nil {
		return false
	}
	// "PID (COMM) STATE ...": COMM may hold anything, so the last ")".
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// runsWith returns pid when it runs and its command line contains word: a
// pid file's pid recycled by an unrelated process does not count.
func runsWith(pid int, word string) (int, bool) {
	if !runs(pid) || !strings.Contains(cmdline(pid), word) {
		return 0, false
	}
	return pid, true
}

// alive returns the pid in run/NAME.pid, when that process runs with word
// in its command line.
func (c *cluster) alive(name, word string) (int, bool) {
	data, err := os.ReadFile(c.path("run", name+".pid"))
	if err != nil {
		return 0, false
	}
	pid, ok := parsePid(data)
	if !ok {
		return 0, false
	}
	return runsWith(pid, word)
}

// patroni returns the pid that runs the member's Patroni, `hacluster reap`
// (reap.go), which passes signals on to it, when it runs.
func (c *cluster) patroni(member string) (int, bool) {
	return c.alive(member, c.path(member+".yml"))
}

// etcd returns the pid of the cluster's etcd, when it runs.
func (c *cluster) etcd() (int, bool) {
	return c.alive("etcd", c.path("etcd.yml"))
}

// postmaster returns the member's postmaster pid (the first line of its
// postmaster.pid), when it runs on the member's data directory.
func (c *cluster) postmaster(member string) (int, bool) {
	data, err := os.ReadFile(c.path(member, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	pid, ok := parsePid(data)
	if !ok {
		return 0, false
	}
	return runsWith(pid, c.path(member))
}

// isClusterProcess reports whether a process, by its comm, command line and
// working directory, belongs to the cluster in dir: Patroni, etcd, pg_rewind,
// pg_basebackup or PostgreSQL naming dir on its command line or working in
// it. PostgreSQL's postmaster changes into its data directory and every
// process it starts inherits that, so a backend whose postmaster was killed,
// orphaned and titled only "postgres: payments-ha: ...", is found by its
// working directory. The title is no clue: every cluster of this
// configuration shares it, one started from another HA_DIR (a test's)
// included.
func isClusterProcess(comm, cmd, cwd, dir string) bool {
	if !slices.Contains([]string{"postgres", "patroni", "etcd"}, comm) && !strings.HasPrefix(comm, "pg_") {
		return false
	}
	return strings.Contains(cmd, dir+"/") || cwd == dir || strings.HasPrefix(cwd, dir+"/")
}

// clusterPids lists every live process of this cluster (isClusterProcess).
// Another user's working directory is readable only as root or as that
// user, who alone may signal it anyway.
func (c *cluster) clusterPids() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if isClusterProcess(strings.TrimSpace(string(comm)), cmdline(pid), cwd, c.dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopPids sends SIGTERM to each, then SIGKILL to those still there after
// grace.
func (c *cluster) stopPids(grace time.Duration, pids ...int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for _, pid := range pids {
		for runs(pid) {
			if time.Now().After(deadline) {
				c.say("pid %d (%s) ignored SIGTERM for %s: SIGKILL", pid, cmdline(pid), grace)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// startBackground starts argv (as postgres, see asPostgres) in a session of
// its own: no controlling terminal, so no SIGHUP when the caller's terminal
// goes, and no signal from the caller's Ctrl-C. It runs in HA_DIR, not in the
// caller's working directory, which may be deleted while it runs (a removed
// git worktree): a Patroni started there could not restart PostgreSQL
// afterwards, pg_ctl failing with "could not locate my own executable path".
// Its output is appended to
// logPath and its pid recorded in run/NAME.pid. The returned channel is
// closed if it exits while this command still runs.
func (c *cluster) startBackground(name, logPath string, argv ...string) (<-chan struct{}, error) {
	argv = append(slices.Clone(c.asPostgres), argv...)
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, fileMode) //nolint:gosec // G304: a log in HA_DIR
	if err != nil {
		return nil, fmt.Errorf("open %s's log: %w", name, err)
	}
	defer logFile.Close()
	// setpriv execs the command in place, so the pid is the command's.
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // G204: etcd or patroni with a configuration in HA_DIR
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	// Reaped if it dies while this command still runs, so that it does not
	// look alive as a zombie; afterwards it is init's.
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	pidFile := c.path("run", name+".pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), fileMode); err != nil {
		return nil, fmt.Errorf("record %s's pid: %w", name, err)
	}
	return exited, nil
}

// portOpen reports whether something accepts TCP connections on
// 127.0.0.1:port.
func portOpen(port int) bool {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// requireFree returns an error, naming what, when port is taken by a
// process that is not this cluster's.
func requireFree(port int, what string) error {
	if portOpen(port) {
		return fmt.Errorf("127.0.0.1:%d (%s) is taken by a process that is not this cluster's; stop it first", port, what)
	}
	return nil
}

// lookPaths returns an error naming every command of names not on PATH.
func lookPaths(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return errors.New("missing: " + strings.Join(missing, " "))
	}
	return nil
}
