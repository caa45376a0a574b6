package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Patroni's roles in GET /cluster.
const (
	roleLeader      = "leader"
	roleSyncStandby = "sync_standby"
	roleReplica     = "replica"
)

// member is one entry of Patroni's GET /cluster.
type member struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, sync_standby, replica
	State    string `json:"state"` // running, streaming, stopped, starting, ...
	Port     int    `json:"port"`
	Timeline int    `json:"timeline"`
}

// String is the member as `wait` shows it when the cluster does not settle:
// name, role, state, PostgreSQL port and timeline, tab-separated.
func (m member) String() string {
	timeline := ""
	if m.Timeline != 0 {
		timeline = strconv.Itoa(m.Timeline)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%d\t%s", m.Name, m.Role, m.State, m.Port, timeline)
}

// parseCluster decodes the members from the body of GET /cluster.
func parseCluster(r io.Reader) ([]member, error) {
	var body struct {
		Members []member `json:"members"`
	}
	if err := json.NewDecoder(r).Decode(&body); err != nil {
		return nil, fmt.Errorf("decode /cluster: %w", err)
	}
	return body.Members, nil
}

// members asks the members' REST APIs for /cluster, in turn, and returns
// the first answer. It returns an error when none answers.
func (c *cluster) members(ctx context.Context) ([]member, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	var err error
	for _, s := range c.ports.specs() {
		var ms []member
		ms, err = getCluster(ctx, client, fmt.Sprintf("http://127.0.0.1:%d/cluster", s.apiPort))
		if err == nil {
			return ms, nil
		}
	}
	return nil, fmt.Errorf("no Patroni REST API answers on 127.0.0.1, ports %s (last: %w)", c.ports.apiPorts(), err)
}

func getCluster(ctx context.Context, client *http.Client, url string) ([]member, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseCluster(resp.Body)
}

// roleMember returns the first member with role. It returns an error when
// no REST API answers or no member has the role.
func (c *cluster) roleMember(ctx context.Context, role string) (member, error) {
	ms, err := c.members(ctx)
	if err != nil {
		return member{}, err
	}
	i := slices.IndexFunc(ms, func(m member) bool { return m.Role == role })
	if i < 0 {
		return member{}, fmt.Errorf("no member is %s now", role)
	}
	return ms[i], nil
}

// roles is the cluster as Patroni names it: the leader, the synchronous
// standby and the other members (replicas).
type roles struct {
	leader, standby member
	replicas        []member
}

// String is the roles as `up` reports them: "leader pg1 5441, sync standby
// pg2 5442, replica pg3 5443".
func (r roles) String() string {
	out := fmt.Sprintf("leader %s %d, sync standby %s %d", r.leader.Name, r.leader.Port, r.standby.Name, r.standby.Port)
	for _, m := range r.replicas {
		out += fmt.Sprintf(", replica %s %d", m.Name, m.Port)
	}
	return out
}

// streams reports whether Patroni shows a standby as running: "running"
// (Patroni 3.0) or "streaming" (later versions).
func streams(m member) bool { return m.State == "running" || m.State == "streaming" }

// settledRoles returns the roles when Patroni shows every member
// running with a port: one leader, one sync standby and the others replicas.
// It says what is missing otherwise.
func settledRoles(ms []member) (roles, error) {
	var r roles
	var leaders, standbys int
	for _, m := range ms {
		switch {
		case m.Role == roleLeader && m.State == "running" && m.Port != 0:
			r.leader, leaders = m, leaders+1
		case m.Role == roleSyncStandby && streams(m) && m.Port != 0 && m.Name != "":
			r.standby, standbys = m, standbys+1
		case m.Role == roleReplica && streams(m) && m.Port != 0 && m.Name != "":
			r.replicas = append(r.replicas, m)
		}
	}
	switch {
	case leaders != 1 || standbys != 1:
		return roles{}, errors.New("no running leader with a running sync standby in Patroni's /cluster")
	case 2+len(r.replicas) != len(memberNames):
		return roles{}, fmt.Errorf("%d running replicas in Patroni's /cluster, want %d", len(r.replicas), len(memberNames)-2)
	}
	return r, nil
}

// leaderView is what the leader's PostgreSQL says of itself and of the
// standbys streaming to it.
type leaderView struct {
	inRecovery       bool
	syncStandbyNames string            // synchronous_standby_names
	replication      map[string]string // pg_stat_replication: application_name → "state/sync_state"
}

const leaderQuery = `
SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       (SELECT coalesce(json_object_agg(application_name, concat(state, '/', sync_state)), '{}')
        FROM pg_stat_replication)`

// standbyNameSep splits synchronous_standby_names ("pg2", `1 ("pg2")`,
// `ANY 1 (pg1, pg2)`) into its words.
var standbyNameSep = regexp.MustCompile(`[\s,()"]+`)

// problem says why the leader does not serve standby as its synchronous
// standby and every one of replicas as a standby, or returns "" when it
// does: it accepts writes, names standby in synchronous_standby_names,
// standby streams to it as synchronous and each replica streams to it.
func (v leaderView) problem(standby string, replicas []string) string {
	switch {
	case v.inRecovery:
		return "it is in recovery"
	case standby == "" || !slices.Contains(standbyNameSep.Split(v.syncStandbyNames, -1), standby):
		return fmt.Sprintf("its synchronous_standby_names %q does not name %s", v.syncStandbyNames, standby)
	case v.replication[standby] != "streaming/sync":
		return fmt.Sprintf("%s does not stream to it as synchronous (%v)", standby, v.replication)
	}
	for _, r := range replicas {
		if state, _, _ := strings.Cut(v.replication[r], "/"); state != "streaming" {
			return fmt.Sprintf("replica %s does not stream to it (%v)", r, v.replication)
		}
	}
	return ""
}

// health returns the roles when the cluster is settled, as the failover
// scenarios require before each fault (internal/chaos/cluster_test.go,
// settle): Patroni names a running leader, a sync standby and the other
// members running replicas (settledRoles), the leader's PostgreSQL serves
// that standby as synchronous and every replica as a standby (leaderView),
// and the standbys' PostgreSQL is in recovery. Otherwise it says what is
// missing. Patroni's word alone lags a fault by up to a loop: right after a
// kill it still shows the dead member as running.
func (c *cluster) health(ctx context.Context) (roles, error) {
	ms, err := c.members(ctx)
	if err != nil {
		return roles{}, err
	}
	r, err := settledRoles(ms)
	if err != nil {
		return roles{}, err
	}
	var v leaderView
	err = query(ctx, r.leader.Port, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, leaderQuery).Scan(&v.inRecovery, &v.syncStandbyNames, &v.replication)
	})
	if err != nil {
		return roles{}, fmt.Errorf("leader %s: %w", r.leader.Name, err)
	}
	replicaNames := make([]string, len(r.replicas))
	for i, m := range r.replicas {
		replicaNames[i] = m.Name
	}
	if p := v.problem(r.standby.Name, replicaNames); p != "" {
		return roles{}, fmt.Errorf("leader %s: %s", r.leader.Name, p)
	}
	for _, m := range append([]member{r.standby}, r.replicas...) {
		var inRecovery bool
		err = query(ctx, m.Port, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		})
		if err != nil {
			return roles{}, fmt.Errorf("%s %s: %w", m.Role, m.Name, err)
		}
		if !inRecovery {
			return roles{}, fmt.Errorf("%s %s is not in recovery", m.Role, m.Name)
		}
	}
	return r, nil
}

// query runs f on a connection to the postgres database of the member
// listening on port, within 5 s.
func query(ctx context.Context, port int, f func(*pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf(
		"host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=2", port))
	if err != nil {
		return fmt.Errorf("connect to 127.0.0.1:%d: %w", port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

// waitHealthy waits up to HA_WAIT for health and returns the roles; on
// timeout it shows the members and the end of every log, and returns an
// error.
func (c *cluster) waitHealthy(ctx context.Context) (roles, error) {
	limit, err := c.waitLimit()
	if err != nil {
		return roles{}, err
	}
	deadline := time.Now().Add(limit)
	next := time.Now().Add(10 * time.Second)
	for {
		r, err := c.health(ctx)
		if err == nil {
			return r, nil
		}
		now := time.Now()
		if !now.Before(deadline) {
			c.showState(ctx)
			return roles{}, fmt.Errorf("no leader with a sync standby and every replica streaming after %d s (HA_WAIT): %w; the members and logs are above",
				int(limit.Seconds()), err)
		}
		if !now.Before(next) {
			c.say("waiting for a leader, a sync standby and every replica streaming (%d s left): %v", int(deadline.Sub(now).Seconds()), err)
			next = now.Add(10 * time.Second)
		}
		select {
		case <-ctx.Done():
			return roles{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// showState logs the members as Patroni sees them and the last lines of
// every log of the cluster.
func (c *cluster) showState(ctx context.Context) {
	c.say("the members:")
	if ms, err := c.members(ctx); err != nil {
		c.say("%v", err)
	} else {
		for _, m := range ms {
			fmt.Fprintln(c.log, m)
		}
	}
	logs, _ := filepath.Glob(c.path("log", "*.log"))
	pgLogs, _ := filepath.Glob(c.path("log", "*", "postgresql.log"))
	for _, l := range append(logs, pgLogs...) {
		c.say("--- last lines of %s", l)
		c.tail(l, 15)
	}
}

// ensureDatabase creates the service's database on the leader (it
// replicates) when missing; `payments migrate up` would create it too, but
// psql to the URL should work straight after `up`.
func (c *cluster) ensureDatabase(ctx context.Context, leader member) error {
	return query(ctx, leader.Port, func(conn *pgx.Conn) error {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'payments')").Scan(&exists); err != nil {
			return fmt.Errorf("look for database payments: %w", err)
		}
		if exists {
			return nil
		}
		c.say("creating database payments")
		if _, err := conn.Exec(ctx, "CREATE DATABASE payments"); err != nil {
			return fmt.Errorf("create database payments: %w", err)
		}
		return nil
	})
}
