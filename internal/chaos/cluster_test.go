package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// cluster is a Patroni cluster of one primary, one synchronous standby and
// one asynchronous replica, which Patroni makes synchronous when the standby
// goes or is promoted, started by make ha-up (scripts/ha.sh, lab/cmd/hacluster).
// The failover
// scenarios run only against one: make chaos-ha names it in PAYMENTS_HA_URL
// (the multi-host URL of its postgres database,
// target_session_attrs=read-write) and PAYMENTS_HA_PATRONI (the members' REST
// API addresses, comma-separated).
type cluster struct {
	url     string
	patroni []string
	rebuilt int // members rebuilt by rebuildStuck so far
}

// haCluster returns the cluster, settled (see settle), or skips t, saying how
// to run it, when none is named.
func haCluster(t *testing.T) *cluster {
	t.Helper()
	u, api := os.Getenv("PAYMENTS_HA_URL"), os.Getenv("PAYMENTS_HA_PATRONI")
	if u == "" || api == "" {
		t.Skip("no Patroni cluster named (PAYMENTS_HA_URL, PAYMENTS_HA_PATRONI): make chaos-ha starts one and runs this scenario")
	}
	c := &cluster{url: u, patroni: strings.Split(api, ",")}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	c.settle(t, ctx, wholeCluster, nil)
	return c
}

// member is one line of Patroni's GET /cluster.
type member struct {
	Name     string `json:"name"`
	Role     string `json:"role"` // leader, sync_standby, replica
	State    string `json:"state"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Timeline int    `json:"timeline"`
	APIURL   string `json:"api_url"` // http://host:port/patroni
}

// String is the member as settle reports it: "pg3=replica/starting/5443/tl8".
func (m member) String() string {
	return fmt.Sprintf("%s=%s/%s/%d/tl%d", m.Name, m.Role, m.State, m.Port, m.Timeline)
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

// roles returns the running leader, synchronous standby and replicas (""
// where none). Patroni's word alone: it shows a member that just died as
// running until that member's next loop.
func (c *cluster) roles() (leader, standby member, replicas []member, err error) {
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
		case "replica":
			replicas = append(replicas, m)
		}
	}
	return leader, standby, replicas, err
}

// settleTimeout bounds the wait for a settled cluster: a member killed by the
// previous scenario may first be rewound and restarted.
const settleTimeout = 90 * time.Second

// server is one member's PostgreSQL as it describes itself, read in one
// connection to it.
type server struct {
	member
	primary    bool   // not in recovery
	dataDir    string // every process of the server has it as its working directory
	postmaster proc
	// syncNames is synchronous_standby_names; replication maps each
	// walsender's application_name to its "state/sync_state" (a primary's).
	syncNames   string
	replication map[string]string
}

// settled is the cluster in the state a fault starts from: Patroni names a
// running leader and a synchronous standby, and their servers agree; and,
// when the whole cluster is asked for, a running replica streaming to the
// leader (replica is the zero server otherwise).
type settled struct{ leader, standby, replica server }

func (s settled) String() string {
	out := fmt.Sprintf("leader %s (postmaster %d, timeline %d), sync standby %s (postmaster %d)",
		s.leader.Name, s.leader.postmaster.pid, s.leader.Timeline, s.standby.Name, s.standby.postmaster.pid)
	if s.replica.Name != "" {
		out += fmt.Sprintf(", replica %s (postmaster %d)", s.replica.Name, s.replica.postmaster.pid)
	}
	return out
}

// How much of the cluster settle waits for: every member (wholeCluster), or a
// leader and a synchronous standby only (leaderAndStandby), which is all a
// primary needs to commit, with the third member maybe still on its way back.
const (
	wholeCluster     = true
	leaderAndStandby = false
)

// settle waits, until ctx ends, for the cluster to be settled (whole: with
// its replica too) and, when ready
// is not nil, for ready (the service's /readyz) to return nil; it returns the
// cluster as it last found it, and fails t with the last thing missing when
// ctx ends first. The cluster is looked at after ready, so that what settle
// returns is as fresh as it can be.
func (c *cluster) settle(t *testing.T, ctx context.Context, whole bool, ready func() error) settled {
	t.Helper()
	began := time.Now()
	var last string
	starting := map[string]time.Time{} // when each member was first seen starting
	for {
		if whole {
			c.rebuildStuck(t, starting)
		}
		var s settled
		err := ctx.Err()
		if err == nil && ready != nil {
			err = ready()
		}
		if err == nil {
			s, err = c.look(ctx, whole)
		}
		if err == nil {
			return s
		}
		if ctx.Err() != nil {
			if last == "" {
				last = err.Error()
			}
			t.Fatalf("the cluster did not settle in %v: %s", time.Since(began).Round(time.Second), last)
		}
		// One line per change of what is missing, not one per look.
		if msg := err.Error(); msg != last {
			t.Logf("not settled after %v: %s", time.Since(began).Round(time.Millisecond), msg)
			last = msg
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stuckAfter is how long a member may be seen starting before settle, waiting
// for the whole cluster, rebuilds it (rebuildStuck); a start takes seconds.
const stuckAfter = 30 * time.Second

// rebuildStuck rebuilds from the leader, saying so, every member that Patroni
// has shown "starting" since stuckAfter ago or longer (POST /reinitialize, as
// `patronictl reinit` does); since records when each member was first seen
// starting, and forgets one seen otherwise. A member whose pg_rewind was cut by its
// source's death (two failovers in a row) is restarted by Patroni 3.0.2
// while no member holds the leader key, so without primary_conninfo, and as
// pg_rewind left it needing WAL past its own it never becomes consistent:
// it stays "starting" for good, and Patroni never points it at the new
// leader (docs/reliability.md, "Failover").
func (c *cluster) rebuildStuck(t *testing.T, since map[string]time.Time) {
	t.Helper()
	ms, err := c.members()
	if err != nil {
		return
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for _, m := range ms {
		first, seen := since[m.Name]
		switch {
		case m.State != "starting":
			delete(since, m.Name)
			continue
		case !seen:
			since[m.Name] = time.Now()
			continue
		case time.Since(first) < stuckAfter || m.APIURL == "":
			continue
		}
		since[m.Name] = time.Now() // once per stuckAfter at most
		t.Logf("%s has been starting for %v: rebuilding it from the leader (POST /reinitialize)", m.Name, stuckAfter)
		resp, err := client.Post(strings.TrimSuffix(m.APIURL, "/patroni")+"/reinitialize", "application/json", strings.NewReader(`{"force": true}`))
		if err != nil {
			t.Logf("reinitialize %s: %v", m.Name, err)
			continue
		}
		resp.Body.Close()
		t.Logf("reinitialize %s: %s", m.Name, resp.Status)
		c.rebuilt++
	}
}

// look returns the cluster if it is settled: Patroni names a running leader
// and a synchronous standby (its sync state); the leader's server is a
// primary whose synchronous_standby_names names that standby, which streams
// to it as synchronous; the standby's server is in recovery. With whole,
// Patroni also names one running replica, whose server is in recovery and
// streams to the leader.
func (c *cluster) look(ctx context.Context, whole bool) (settled, error) {
	leader, standby, replicas, err := c.roles()
	if err != nil {
		return settled{}, err
	}
	if leader.Name == "" || standby.Name == "" || whole && len(replicas) != 1 {
		ms, _ := c.members()
		return settled{}, fmt.Errorf("Patroni names no running leader, synchronous standby and replica: %v", ms)
	}
	var s settled
	if s.leader, err = c.describe(ctx, leader); err != nil {
		return settled{}, err
	}
	if s.standby, err = c.describe(ctx, standby); err != nil {
		return settled{}, err
	}
	switch {
	case !s.leader.primary:
		return settled{}, fmt.Errorf("Patroni names %s leader, but its server is in recovery", leader.Name)
	case s.standby.primary:
		return settled{}, fmt.Errorf("Patroni names %s sync standby, but its server is a primary", standby.Name)
	case !namesStandby(s.leader.syncNames, standby.Name):
		return settled{}, fmt.Errorf("%s's synchronous_standby_names is %q, not naming %s", leader.Name, s.leader.syncNames, standby.Name)
	case s.leader.replication[standby.Name] != "streaming/sync":
		return settled{}, fmt.Errorf("%s does not stream to %s as its synchronous standby: %v", standby.Name, leader.Name, s.leader.replication)
	}
	if !whole {
		return s, nil
	}
	if s.replica, err = c.describe(ctx, replicas[0]); err != nil {
		return settled{}, err
	}
	if state, _, _ := strings.Cut(s.leader.replication[s.replica.Name], "/"); s.replica.primary || state != "streaming" {
		return settled{}, fmt.Errorf("replica %s is not a standby streaming to %s: %v", s.replica.Name, leader.Name, s.leader.replication)
	}
	return s, nil
}

// namesStandby reports whether synchronous_standby_names (a list, maybe
// quoted, maybe inside "FIRST n (...)" or "ANY n (...)") names standby.
func namesStandby(syncNames, standby string) bool {
	fields := strings.FieldsFunc(syncNames, func(r rune) bool { return strings.ContainsRune(` ,()"`, r) })
	return slices.Contains(fields, standby)
}

// describe asks m's server what it is.
func (c *cluster) describe(ctx context.Context, m member) (server, error) {
	conn, err := pgx.Connect(ctx, c.memberURL(m))
	if err != nil {
		return server{}, fmt.Errorf("connect to %s: %w", m.Name, err)
	}
	defer conn.Close(ctx)
	s := server{member: m, replication: map[string]string{}}
	var pidFile string
	if err := conn.QueryRow(ctx, `
SELECT pg_read_file('postmaster.pid'), NOT pg_is_in_recovery(), current_setting('data_directory'),
       current_setting('synchronous_standby_names')`).Scan(&pidFile, &s.primary, &s.dataDir, &s.syncNames); err != nil {
		return server{}, fmt.Errorf("ask %s what it is: %w", m.Name, err)
	}
	rows, err := conn.Query(ctx, `SELECT application_name, concat(state, '/', sync_state) FROM pg_stat_replication`)
	if err != nil {
		return server{}, fmt.Errorf("ask %s whom it streams to: %w", m.Name, err)
	}
	var name, state string
	if _, err := pgx.ForEachRow(rows, []any{&name, &state}, func() error {
		s.replication[name] = state
		return nil
	}); err != nil {
		return server{}, fmt.Errorf("ask %s whom it streams to: %w", m.Name, err)
	}
	first, _, _ := strings.Cut(pidFile, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return server{}, fmt.Errorf("%s's postmaster.pid: %w", m.Name, err)
	}
	if s.postmaster, err = procOf(pid); err != nil {
		return server{}, fmt.Errorf("%s's postmaster: %w", m.Name, err)
	}
	return s, nil
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

// errMoved says that the cluster was no longer as settle had found it when
// the fault came to it: the scenario settles again instead of faulting a
// member that has changed role.
var errMoved = errors.New("the cluster moved since it settled")

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
