// Command hacluster runs a PostgreSQL HA cluster on this machine, for
// development and the failover tests. scripts/ha.sh builds it into
// bin/hacluster and runs it; `make ha-up`, `make ha-down` and `make ha-status`
// call that.
//
// One etcd and three Patroni members, pg1 (PostgreSQL 127.0.0.1:5441,
// Patroni REST 127.0.0.1:8441), pg2 (5442, 8442) and pg3 (5443, 8443): a
// primary, a synchronous standby and a replica that Patroni makes synchronous
// when the standby goes, in strict mode, so that losing any one member keeps
// writes going. The configuration is deploy/ha/*.in, rendered into
// HA_DIR; data, logs, sockets and pid files live there too, outside the
// repository. Nothing uses systemd: the processes are started in sessions of
// their own (setsid), so they outlive the command that ran `up`, and with
// HA_DIR as their working directory, so that none depends on the caller's.
// Each Patroni runs under `hacluster reap` (reap.go), which reaps its
// postmaster the moment it dies, so that Patroni fails over at once however
// slowly the machine's PID 1 reaps.
//
//	hacluster up            start what is not running, wait for a settled
//	                        cluster (a leader, a sync standby and the other
//	                        replica streaming to it, see health in
//	                        cluster.go), create database
//	                        payments, print the DATABASE_URL (the only line
//	                        on stdout)
//	hacluster down          stop everything, delete HA_DIR
//	hacluster status        the processes and `patronictl list`
//	hacluster wait          wait for a settled cluster again (after a fault)
//	hacluster url           the DATABASE_URL
//	hacluster api           the members' REST API URLs, comma-separated (what
//	                        internal/chaos reads from PAYMENTS_HA_PATRONI)
//	hacluster primary       the leader's name and port: "pg1 5441"
//	hacluster standby       the sync standby's name and port
//	hacluster pid MEMBER    the postmaster pid of pg1, pg2 or pg3 (from its postmaster.pid)
//	hacluster ctl ARGS...   patronictl with the cluster's configuration, e.g.
//	                        `hacluster ctl switchover --force`
//
// What it reports goes to stderr, each line prefixed "ha: "; stdout carries
// only the answers (the URL, "pg1 5441", a pid, patronictl's table).
// Environment: HA_DIR (default /var/tmp/payments-ha), HA_WAIT (seconds `up`
// and `wait` wait for a healthy cluster, default 90), and the ports (ports.go):
// HA_PG_PORT (default 5441: pg1, pg2 and pg3 on it and the next two),
// HA_PATRONI_PORT (default 8441, likewise) and HA_ETCD_PORT (default 23790,
// the peer port 10 above). A second cluster runs beside the first with
// another HA_DIR and ports that do not clash, e.g. HA_DIR=/var/tmp/payments-ha2
// HA_PG_PORT=5451 HA_PATRONI_PORT=8451 HA_ETCD_PORT=23890; every command on a
// cluster needs the ports it was started with, which `up` records in HA_DIR
// and the other commands check.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if code, ok := errors.AsType[exitError](err); ok { // reap's child's status, already told
		os.Exit(int(code))
	}
	if err != nil {
		for line := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintln(os.Stderr, "ha:", line)
		}
		os.Exit(1)
	}
}

const usage = `usage: hacluster up|down|status|wait|url|api|primary|standby|pid MEMBER|ctl ARGS...
(scripts/ha.sh builds and runs it; go doc ./lab/cmd/hacluster says what each does)`

// run is the whole program behind main: the command table.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var cmd string
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	if cmd == "reap" { // how up runs Patroni (reap.go); not for operators
		return reap(args)
	}
	p, err := readPorts(getenv)
	if err != nil {
		return err
	}
	switch cmd { // make reads these while parsing: they need only the ports
	case "url":
		_, err := fmt.Fprintln(stdout, p.databaseURL())
		return err
	case "api":
		_, err := fmt.Fprintln(stdout, p.patroniURLs())
		return err
	}
	c, err := newCluster(getenv, p, stderr)
	if err != nil {
		return err
	}
	if cmd != "down" { // down stops the processes of HA_DIR, on whatever ports
		if err := c.checkRecordedPorts(); err != nil {
			return err
		}
	}
	switch cmd {
	case "up":
		return c.up(ctx, stdout)
	case "down":
		return c.down()
	case "status":
		return c.status(ctx, stdout)
	case "wait":
		_, err := c.waitHealthy(ctx)
		return err
	case "primary":
		return c.printRole(ctx, stdout, roleLeader)
	case "standby":
		return c.printRole(ctx, stdout, roleSyncStandby)
	case "pid":
		return c.printPostmaster(args, stdout)
	case "ctl":
		return c.ctl(args)
	default:
		return errors.New(usage)
	}
}

// spec is one member's name and ports, as deploy/ha/patroni.yml.in gets them.
type spec struct {
	name    string
	pgPort  int
	apiPort int
}

// cluster is the cluster in one HA_DIR, and where to say what happens to it.
type cluster struct {
	dir     string // HA_DIR, absolute and clean
	waitEnv string // HA_WAIT as given; parsed by waitLimit when needed
	ports   ports  // HA_PG_PORT, HA_PATRONI_PORT, HA_ETCD_PORT
	log     io.Writer
	// asPostgres prefixes the commands that start etcd and Patroni: as root,
	// setpriv runs them as the postgres OS user. PostgreSQL refuses to run
	// as root, and the data it writes must belong to the user that runs it.
	// --reset-env: no PATRONI_* or PG* variable of the caller leaks in.
	asPostgres []string
}

// newCluster reads HA_DIR and HA_WAIT, for a cluster on p. It returns an
// error when HA_DIR is not an absolute path: `down` deletes it.
func newCluster(getenv func(string) string, p ports, log io.Writer) (*cluster, error) {
	dir := getenv("HA_DIR")
	if dir == "" {
		dir = "/var/tmp/payments-ha"
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) == "/" {
		return nil, fmt.Errorf("HA_DIR must be an absolute path below /, not %q", dir)
	}
	c := &cluster{dir: filepath.Clean(dir), waitEnv: getenv("HA_WAIT"), ports: p, log: log}
	if os.Geteuid() == 0 {
		c.asPostgres = []string{"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--reset-env"}
	}
	return c, nil
}

// waitLimit is HA_WAIT, how long up and wait wait for a healthy cluster.
func (c *cluster) waitLimit() (time.Duration, error) {
	if c.waitEnv == "" {
		return 90 * time.Second, nil
	}
	n, err := strconv.Atoi(c.waitEnv)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("HA_WAIT must be a whole number of seconds, not %q", c.waitEnv)
	}
	return time.Duration(n) * time.Second, nil
}

// say logs one line to stderr.
func (c *cluster) say(format string, args ...any) {
	fmt.Fprintf(c.log, "ha: "+format+"\n", args...)
}

// path is a path inside HA_DIR.
func (c *cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.dir}, elem...)...)
}

// printRole prints "name port" of the member with role.
func (c *cluster) printRole(ctx context.Context, stdout io.Writer, role string) error {
	m, err := c.roleMember(ctx, role)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, m.Name, m.Port)
	return err
}

// printPostmaster prints the postmaster pid of the member args names.
func (c *cluster) printPostmaster(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: hacluster pid pg1|pg2|pg3")
	}
	s, err := c.ports.lookupSpec(args[0])
	if err != nil {
		return err
	}
	pid, ok := c.postmaster(s.name)
	if !ok {
		return fmt.Errorf("%s's postmaster is not running", s.name)
	}
	_, err = fmt.Fprintln(stdout, pid)
	return err
}
