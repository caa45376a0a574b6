package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"syscall"
	"time"
)

// pgBin holds the PostgreSQL that deploy/ha/patroni.yml.in names (bin_dir).
const pgBin = "/usr/lib/postgresql/15/bin"

// up starts what is not running, waits for a settled cluster (a leader, a
// sync standby and the third member streaming), creates database payments
// and prints the DATABASE_URL.
func (c *cluster) up(ctx context.Context, stdout io.Writer) error {
	if err := c.checkTools(); err != nil {
		return err
	}
	tmpl, err := templateDir()
	if err != nil {
		return err
	}
	started := time.Now()
	if err := c.prepare(tmpl); err != nil {
		return err
	}
	if err := c.startEtcd(); err != nil {
		return err
	}
	for _, s := range c.ports.specs() {
		if err := c.startMember(s); err != nil {
			return err
		}
	}
	r, err := c.waitHealthy(ctx)
	if err != nil {
		return err
	}
	if err := c.ensureDatabase(ctx, r.leader); err != nil {
		return err
	}
	c.say("up in %d s: %v", int(time.Since(started).Seconds()), r)
	c.say("logs in %s; stop with: make ha-down", c.path("log"))
	_, err = fmt.Fprintln(stdout, c.ports.databaseURL())
	return err
}

// checkTools returns an error, saying how to install them, when a program
// the cluster runs is missing, or (as root) the postgres OS user.
func (c *cluster) checkTools() error {
	tools := []string{"patroni", "patronictl", "etcd"}
	if len(c.asPostgres) > 0 {
		tools = append(tools, c.asPostgres[0])
	}
	err := lookPaths(tools...)
	if fi, statErr := os.Stat(pgBin + "/postgres"); statErr != nil || fi.Mode()&0o111 == 0 {
		err = errors.Join(err, errors.New("missing: "+pgBin+"/postgres"))
	}
	if err != nil {
		return fmt.Errorf("%w\ninstall them: apt-get install -y patroni etcd-server etcd-client postgresql-15", err)
	}
	if len(c.asPostgres) > 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return errors.New("no postgres OS user to run PostgreSQL as (the postgresql-15 package creates it)")
		}
	}
	return nil
}

// startEtcd starts etcd unless it runs, and waits up to 15 s for its client
// port.
func (c *cluster) startEtcd() error {
	if _, ok := c.etcd(); ok {
		return nil
	}
	if err := requireFree(c.ports.etcd, "etcd client"); err != nil {
		return err
	}
	if err := requireFree(c.ports.etcdPeer(), "etcd peer"); err != nil {
		return err
	}
	logPath := c.path("log", "etcd.log")
	c.say("starting etcd on 127.0.0.1:%d (log: %s)", c.ports.etcd, logPath)
	exited, err := c.startBackground("etcd", logPath, "etcd", "--config-file", c.path("etcd.yml"))
	if err != nil {
		return err
	}
	// Whether etcd died is told by its exit, not by its command line: twice
	// a start failed at once, "etcd did not start", with an etcd that was up
	// a moment later, most likely because /proc/PID/cmdline was read while
	// setpriv was exec'ing etcd, when it can be empty.
wait:
	for range 60 {
		if portOpen(c.ports.etcd) {
			return nil
		}
		select {
		case <-exited:
			break wait
		case <-time.After(250 * time.Millisecond):
		}
	}
	c.tail(logPath, 20)
	return fmt.Errorf("etcd did not start (log above: %s)", logPath)
}

// startMember starts the member's Patroni unless it runs; Patroni starts
// (or first initialises or clones) its PostgreSQL. A postmaster left running
// by a Patroni that was killed is adopted by the new Patroni, so its port is
// not a clash.
func (c *cluster) startMember(s spec) error {
	if _, ok := c.patroni(s.name); ok {
		return nil
	}
	if _, ok := c.postmaster(s.name); !ok {
		if err := requireFree(s.pgPort, "PostgreSQL of "+s.name); err != nil {
			return err
		}
	}
	if err := requireFree(s.apiPort, "Patroni REST API of "+s.name); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find hacluster to run Patroni under: %w", err)
	}
	logPath := c.path("log", s.name+"-patroni.log")
	c.say("starting %s: PostgreSQL 127.0.0.1:%d, Patroni 127.0.0.1:%d (log: %s)", s.name, s.pgPort, s.apiPort, logPath)
	_, err = c.startBackground(s.name, logPath, exe, "reap", "patroni", c.path(s.name+".yml"))
	return err
}

// down stops everything and deletes HA_DIR. It returns an error when a
// process of the cluster survives SIGKILL, or when HA_DIR exists without the marker.
func (c *cluster) down() error {
	// Patroni stops its PostgreSQL on SIGTERM (a primary with a live standby
	// first hands the leader key over, a sync standby first waits up to two
	// loops to be released); both at once, since all is deleted anyway. They
	// need etcd meanwhile, so etcd stops last.
	var stopping []int
	for _, name := range memberNames {
		if pid, ok := c.patroni(name); ok {
			c.say("stopping %s (Patroni pid %d)", name, pid)
			stopping = append(stopping, pid)
		}
	}
	c.stopPids(60*time.Second, stopping...)
	// A postmaster whose Patroni was killed (a chaos test may do that) is
	// still there: SIGQUIT is PostgreSQL's immediate shutdown.
	for _, name := range memberNames {
		if pid, ok := c.postmaster(name); ok {
			c.say("stopping %s's orphaned postmaster (pid %d)", name, pid)
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
	}
	if pid, ok := c.etcd(); ok {
		c.say("stopping etcd (pid %d)", pid)
		c.stopPids(30*time.Second, pid)
	}
	if err := c.killLeftovers(); err != nil {
		return err
	}
	switch _, err := os.Stat(c.path(marker)); {
	case err == nil:
		if err := os.RemoveAll(c.dir); err != nil {
			return fmt.Errorf("remove HA_DIR: %w", err)
		}
		c.say("down; removed %s", c.dir)
	case dirExists(c.dir):
		return fmt.Errorf("%s was not made by hacluster (no %s in it); not removing it", c.dir, marker)
	default:
		c.say("down; nothing in %s", c.dir)
	}
	return nil
}

// killLeftovers waits 10 s for what is left of the cluster (backends of a
// killed postmaster that have not yet noticed its death, a pg_rewind, a
// postmaster shutting down) to end, then SIGKILLs it.
func (c *cluster) killLeftovers() error {
	deadline := time.Now().Add(10 * time.Second)
	for left := c.clusterPids(); len(left) > 0; left = c.clusterPids() {
		if time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for _, pid := range left {
			c.say("pid %d (%s) still runs: SIGKILL", pid, cmdline(pid))
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(500 * time.Millisecond)
		if left := c.clusterPids(); len(left) > 0 {
			return fmt.Errorf("these processes of the cluster survived SIGKILL: %v", left)
		}
		break
	}
	return nil
}

func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// status logs the processes and prints `patronictl list` and the
// DATABASE_URL when anything of the cluster runs.
func (c *cluster) status(ctx context.Context, stdout io.Writer) error {
	anything := false
	if pid, ok := c.etcd(); ok {
		c.say("etcd: pid %d, 127.0.0.1:%d", pid, c.ports.etcd)
		anything = true
	} else {
		c.say("etcd: not running")
	}
	for _, s := range c.ports.specs() {
		pid, ok := c.patroni(s.name)
		if !ok {
			c.say("%s: Patroni not running", s.name)
			continue
		}
		postmaster := "none"
		if pm, ok := c.postmaster(s.name); ok {
			postmaster = fmt.Sprint(pm)
		}
		c.say("%s: Patroni pid %d, postmaster pid %s, PostgreSQL 127.0.0.1:%d", s.name, pid, postmaster, s.pgPort)
		anything = true
	}
	if !anything {
		return nil
	}
	// patronictl retries for as long as etcd does not answer: bounded.
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	list := exec.CommandContext(ctx, "patronictl", "-c", c.path("pg1.yml"), "list") //nolint:gosec // G204: the cluster's configuration in HA_DIR
	list.Stdout, list.Stderr = stdout, c.log
	if err := list.Run(); err != nil {
		c.say("patronictl list failed (etcd down?): %v", err)
	}
	_, err := fmt.Fprintf(stdout, "DATABASE_URL=%s\n", c.ports.databaseURL())
	return err
}

// ctl replaces this process with patronictl on the cluster's configuration.
func (c *cluster) ctl(args []string) error {
	conf := c.path("pg1.yml")
	if _, err := os.Stat(conf); err != nil {
		return fmt.Errorf("no cluster in %s; start it with: make ha-up", c.dir)
	}
	path, err := exec.LookPath("patronictl")
	if err != nil {
		return err
	}
	argv := append([]string{"patronictl", "-c", conf}, args...)
	return syscall.Exec(path, argv, os.Environ()) //nolint:gosec // G204: the operator's own patronictl arguments
}

// tail logs the last n lines of the file at path.
func (c *cluster) tail(path string, n int) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: a log in HA_DIR
	if err != nil {
		return
	}
	_, _ = c.log.Write(lastLines(data, n))
}

// lastLines returns the last n lines of data, ending in a newline.
func lastLines(data []byte, n int) []byte {
	data = bytes.TrimSuffix(data, []byte("\n"))
	start := len(data)
	for range n {
		i := bytes.LastIndexByte(data[:start], '\n')
		if i < 0 {
			start = 0
			break
		}
		start = i
	}
	out := strings.TrimPrefix(string(data[start:]), "\n")
	if out == "" {
		return nil
	}
	return []byte(out + "\n")
}
