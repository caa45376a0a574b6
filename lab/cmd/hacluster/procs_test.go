package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestIsClusterProcess(t *testing.T) {
	t.Parallel()
	const dir = "/var/tmp/payments-ha"
	tests := []struct {
		name, comm, cmd, cwd string
		want                 bool
	}{
		{"patroni", "patroni", "/usr/bin/python3 /usr/bin/patroni /var/tmp/payments-ha/pg1.yml", dir, true},
		{"patroni started elsewhere", "patroni", "/usr/bin/python3 /usr/bin/patroni /var/tmp/payments-ha/pg1.yml", "/home/dev", true},
		{"etcd", "etcd", "etcd --config-file /var/tmp/payments-ha/etcd.yml", dir, true},
		{"postmaster", "postgres", "/usr/lib/postgresql/15/bin/postgres -D /var/tmp/payments-ha/pg2 --config-file=/var/tmp/payments-ha/pg2/postgresql.conf", dir + "/pg2", true},
		{"orphaned backend, found by its working directory", "postgres", "postgres: payments-ha: postgres payments 127.0.0.1(40312) idle", dir + "/pg1", true},
		{"walsender", "postgres", "postgres: payments-ha: walsender replicator 127.0.0.1(5123) streaming 0/3000148", dir + "/pg3", true},
		{"pg_rewind", "pg_rewind", "/usr/lib/postgresql/15/bin/pg_rewind -D /var/tmp/payments-ha/pg1 --source-server=...", dir, true},
		{"pg_basebackup", "pg_basebackup", "pg_basebackup --pgdata=/var/tmp/payments-ha/pg2 -X stream", dir, true},
		{"another HA_DIR's backend, same title", "postgres", "postgres: payments-ha: postgres payments 127.0.0.1(40312) idle", "/tmp/TestX/ha/pg1", false},
		{"a backend whose working directory is unreadable", "postgres", "postgres: payments-ha: checkpointer", "", false},
		{"the local PostgreSQL", "postgres", "postgres: 15/main: checkpointer", "/var/lib/postgresql/15/main", false},
		{"the local PostgreSQL's postmaster", "postgres", "/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main", "/var/lib/postgresql/15/main", false},
		{"another HA_DIR sharing the prefix", "postgres", "postgres -D /var/tmp/payments-ha2/pg1", "/var/tmp/payments-ha2/pg1", false},
		{"a shell in HA_DIR", "bash", "bash -c tail -f /var/tmp/payments-ha/log/etcd.log", dir, false},
		{"an editor of a log", "less", "less /var/tmp/payments-ha/log/pg1-patroni.log", dir + "/log", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := isClusterProcess(tt.comm, tt.cmd, tt.cwd, dir); got != tt.want {
				t.Errorf("isClusterProcess(%q, %q, %q) = %v, want %v", tt.comm, tt.cmd, tt.cwd, got, tt.want)
			}
		})
	}
}

func TestJoinCmdline(t *testing.T) {
	t.Parallel()
	got := joinCmdline([]byte("etcd\x00--config-file\x00/var/tmp/payments-ha/etcd.yml\x00"))
	if got != "etcd --config-file /var/tmp/payments-ha/etcd.yml " {
		t.Errorf("joinCmdline = %q", got)
	}
}

func TestParsePid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		data string
		want int
		ok   bool
	}{
		{"4242\n", 4242, true},
		{"4242\n/var/tmp/payments-ha/pg1\n1700000000\n5441\n", 4242, true}, // postmaster.pid
		{" 17 \n", 17, true},
		{"", 0, false},
		{"0\n", 0, false},  // kill(0) signals our own process group
		{"-1\n", 0, false}, // kill(-1) signals every process
		{"pid\n", 0, false},
	}
	for _, tt := range tests {
		pid, ok := parsePid([]byte(tt.data))
		if ok != tt.ok || ok && pid != tt.want {
			t.Errorf("parsePid(%q) = %d, %v; want %d, %v", tt.data, pid, ok, tt.want, tt.ok)
		}
	}
}

// sleeper starts a process that runs for a minute with args on its command
// line, and kills it when the test ends.
func sleeper(t *testing.T, args ...string) int {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", "sleep 60", "sh"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

func writePid(t *testing.T, path string, pid int) {
	t.Helper()
	if err := os.MkdirAll(path[:strings.LastIndex(path, "/")], 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAliveChecksTheCommandLine(t *testing.T) {
	t.Parallel()
	c, _ := testCluster(t)
	etcd := sleeper(t, "etcd", "--config-file", c.path("etcd.yml"))
	writePid(t, c.path("run", "etcd.pid"), etcd)
	if pid, ok := c.etcd(); !ok || pid != etcd {
		t.Errorf("etcd() = %d, %v; want %d (its command line names etcd.yml)", pid, ok, etcd)
	}
	// A pid recycled by an unrelated process: this test's own.
	writePid(t, c.path("run", "pg1.pid"), os.Getpid())
	if pid, ok := c.patroni("pg1"); ok {
		t.Errorf("patroni(pg1) = %d for a process that does not name pg1.yml", pid)
	}
	if _, ok := c.patroni("pg2"); ok {
		t.Error("patroni(pg2) without a pid file")
	}
}

func TestPostmasterChecksTheDataDirectory(t *testing.T) {
	t.Parallel()
	c, _ := testCluster(t)
	pm := sleeper(t, "-D", c.path("pg1"))
	writePid(t, c.path("pg1", "postmaster.pid"), pm)
	writePid(t, c.path("pg2", "postmaster.pid"), pm) // pg1's postmaster, not pg2's
	if pid, ok := c.postmaster("pg1"); !ok || pid != pm {
		t.Errorf("postmaster(pg1) = %d, %v; want %d", pid, ok, pm)
	}
	if pid, ok := c.postmaster("pg2"); ok {
		t.Errorf("postmaster(pg2) = %d, but that process runs on pg1's data", pid)
	}
}

func TestRunsIgnoresZombies(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	// Not reaped, true becomes a zombie: signal 0 still reaches it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if strings.Contains(string(stat), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("true did not exit: %s", stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("kill -0 of a zombie: %v", err)
	}
	if runs(pid) {
		t.Error("runs() says a zombie runs")
	}
	if !runs(os.Getpid()) {
		t.Error("runs() says this test does not run")
	}
}

func TestStartBackgroundThenStop(t *testing.T) {
	t.Parallel()
	c, log := testCluster(t)
	if err := os.MkdirAll(c.path("run"), 0o750); err != nil {
		t.Fatal(err)
	}
	logPath := c.path("etcd.log")
	// A stand-in for etcd that names its configuration and ignores SIGTERM.
	_, err := c.startBackground("etcd", logPath, "sh", "-c", "trap '' TERM; echo started; while :; do sleep 0.1; done", "sh", c.path("etcd.yml"))
	if err != nil {
		t.Fatalf("startBackground: %v", err)
	}
	pid, ok := c.etcd()
	if !ok {
		t.Fatal("the started process is not found by its pid file")
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if sid := session(t, pid); sid != pid {
		t.Errorf("session = %d, want one of its own (%d)", sid, pid)
	}
	// In HA_DIR, not in the caller's working directory, which may be deleted
	// while the cluster runs.
	if cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); err != nil || cwd != c.dir {
		t.Errorf("working directory = %q (%v), want HA_DIR %s", cwd, err, c.dir)
	}
	deadline := time.Now().Add(5 * time.Second)
	for out, _ := os.ReadFile(logPath); string(out) != "started\n"; out, _ = os.ReadFile(logPath) {
		if time.Now().After(deadline) {
			t.Fatalf("log = %q, want its output", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.stopPids(500*time.Millisecond, pid)
	// SIGKILL is sent, not awaited: give the kernel a moment.
	for deadline := time.Now().Add(2 * time.Second); runs(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still runs after stopPids")
		}
	}
	if !strings.Contains(log.String(), "ignored SIGTERM") {
		t.Errorf("no SIGKILL said: %q", log)
	}
}

// session returns the session id of pid, from /proc/PID/stat: "PID (COMM)
// STATE PPID PGRP SESSION ...".
func session(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndex(string(stat), ")")+1:]))
	sid, err := strconv.Atoi(fields[3])
	if err != nil {
		t.Fatal(err)
	}
	return sid
}
