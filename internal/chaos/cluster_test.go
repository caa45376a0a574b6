package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// cluster is a Patroni cluster of one primary and one synchronous standby,
// started by make ha-up (scripts/ha.sh). The failover scenarios run only
// against one: make chaos-ha names it in PAYMENTS_HA_URL (the multi-host URL
// of its postgres database, target_session_attrs=read-write) and
// PAYMENTS_HA_PATRONI (the members' REST API addresses, comma-separated).
type cluster struct {
	url     string
	patroni []string
}

// haCluster returns the cluster, or skips t, saying how to run it, when none
// is named.
func haCluster(t *testing.T) *cluster {
	t.Helper()
	u, api := os.Getenv("PAYMENTS_HA_URL"), os.Getenv("PAYMENTS_HA_PATRONI")
	if u == "" || api == "" {
		t.Skip("no Patroni cluster named (PAYMENTS_HA_URL, PAYMENTS_HA_PATRONI): make chaos-ha starts one and runs this scenario")
	}
	c := &cluster{url: u, patroni: strings.Split(api, ",")}
	c.waitHealthy(t, 60*time.Second)
	return c
}

// member is one line of Patroni's GET /cluster.
type member struct {
	Name  string `json:"name"`
	Role  string `json:"role"` // leader, sync_standby, replica
	State string `json:"state"`
	Host  string `json:"host"`
	Port  int    `json:"port"`
}

// members asks the first member's REST API that answers for the cluster.
func (c *cluster) members() ([]member, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	var lastErr error
	for _, api := range c.patroni {
		resp, err := client.Get(api + "/cluster")
		if err != nil {
			lastErr = err
			continue
		}
		var body struct{ Members []member }
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		return body.Members, nil
	}
	return nil, fmt.Errorf("no Patroni REST API answered: %w", lastErr)
}

// roles returns the running leader and synchronous standby ("" where none).
func (c *cluster) roles() (leader, standby member, err error) {
	ms, err := c.members()
	for _, m := range ms {
		if m.State != "running" && m.State != "streaming" {
			continue
		}
		switch m.Role {
		case "leader":
			leader = m
		case "sync_standby":
			standby = m
		}
	}
	return leader, standby, err
}

// waitHealthy waits until the cluster has a running leader and a synchronous
// standby, and fails t after d.
func (c *cluster) waitHealthy(t *testing.T, d time.Duration) (leader, standby member) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		leader, standby, err := c.roles()
		if leader.Name != "" && standby.Name != "" {
			return leader, standby
		}
		if time.Now().After(deadline) {
			ms, _ := c.members()
			t.Fatalf("the cluster has no leader and synchronous standby after %v: %+v (%v)", d, ms, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// memberURL is the URL of one member's postgres database, whatever its role.
func (c *cluster) memberURL(m member) string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=2", netJoin(m.Host, m.Port))
}

func netJoin(host string, port int) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// postmasterPID reads m's postmaster's process id from its postmaster.pid.
func (c *cluster) postmasterPID(ctx context.Context, m member) (int, error) {
	conn, err := pgx.Connect(ctx, c.memberURL(m))
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var file string
	if err := conn.QueryRow(ctx, `SELECT pg_read_file('postmaster.pid')`).Scan(&file); err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(file, "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// signal sends sig to m's postmaster.
func (c *cluster) signal(ctx context.Context, m member, sig syscall.Signal) error {
	pid, err := c.postmasterPID(ctx, m)
	if err != nil {
		return fmt.Errorf("postmaster of %s: %w", m.Name, err)
	}
	return syscall.Kill(pid, sig)
}

// processGroup returns m's postmaster and every process it started (the
// walreceiver, the startup process, the backends): SIGSTOP on the postmaster
// alone would leave its walreceiver acknowledging. Read it before stopping
// them: a stopped server answers no query.
func (c *cluster) processGroup(ctx context.Context, m member) ([]int, error) {
	pid, err := c.postmasterPID(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("postmaster of %s: %w", m.Name, err)
	}
	pids := []int{pid}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so read after ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			pids = append(pids, child)
		}
	}
	return pids, nil
}

// signalAll sends sig to every process of pids that still runs.
func signalAll(pids []int, sig syscall.Signal) error {
	for _, p := range pids {
		if err := syscall.Kill(p, sig); err != nil && err != syscall.ESRCH {
			return err
		}
	}
	return nil
}

// switchover asks Patroni for a planned switchover from leader to standby.
func (c *cluster) switchover(leader, standby member) error {
	body, _ := json.Marshal(map[string]string{"leader": leader.Name, "candidate": standby.Name})
	client := &http.Client{Timeout: 60 * time.Second}
	var lastErr error
	for _, api := range c.patroni {
		resp, err := client.Post(api+"/switchover", "application/json", bytes.NewReader(body))
		if err != nil {
			lastErr = err
			continue
		}
		msg := new(bytes.Buffer)
		_, _ = msg.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("switchover: %d %s", resp.StatusCode, msg)
		}
		return nil
	}
	return lastErr
}

// newDatabase creates a database on the cluster and returns its multi-host
// URL; the test's cleanup drops it, on whichever member leads by then.
func (c *cluster) newDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "chaos_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	conn, err := pgx.Connect(ctx, c.url)
	must(t, err, "connect to the cluster")
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	must(t, err, "create database %s", name)
	// The standby has the database once it has replayed its creation, which
	// a synchronous commit does not wait for; pgx, trying a multi-host URL's
	// hosts in order, stops at a member that says it does not exist.
	ms, err := c.members()
	must(t, err, "list members")
	for _, m := range ms {
		memberDB := strings.Replace(c.memberURL(m), "/postgres?", "/"+name+"?", 1)
		for deadline := time.Now().Add(20 * time.Second); ; {
			mc, err := pgx.Connect(ctx, memberDB)
			if err == nil {
				mc.Close(ctx)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("database %s is not on %s after 20 s: %v", name, m.Name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.url)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return withDatabase(t, c.url, name)
}

// withDatabase replaces the database of a multi-host URL (which net/url does
// not parse), adding connect_timeout=2 unless it has one: a member that does
// not answer at all must not hold a connection attempt for long.
func withDatabase(t *testing.T, u, name string) string {
	t.Helper()
	base, query, _ := strings.Cut(u, "?")
	slash := strings.LastIndex(base, "/")
	if slash < len("postgres://") {
		t.Fatalf("PAYMENTS_HA_URL %q names no database", u)
	}
	if !strings.Contains(query, "connect_timeout=") {
		query = strings.TrimPrefix(query+"&connect_timeout=2", "&")
	}
	return base[:slash+1] + name + "?" + query
}
