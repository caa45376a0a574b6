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
	"time"

	"github.com/jackc/pgx/v5"
)

// Patroni's roles in GET /cluster.
const (
	roleLeader      = "leader"
	roleSyncStandby = "sync_standby"
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
func members(ctx context.Context) ([]member, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	var err error
	for _, s := range specs {
		var ms []member
		ms, err = getCluster(ctx, client, fmt.Sprintf("http://127.0.0.1:%d/cluster", s.apiPort))
		if err == nil {
			return ms, nil
		}
	}
	return nil, fmt.Errorf("no Patroni REST API answers on 127.0.0.1:%d or :%d (last: %w)",
		specs[0].apiPort, specs[1].apiPort, err)
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
func roleMember(ctx context.Context, role string) (member, error) {
	ms, err := members(ctx)
	if err != nil {
		return member{}, err
	}
	i := slices.IndexFunc(ms, func(m member) bool { return m.Role == role })
	if i < 0 {
		return member{}, fmt.Errorf("no member is %s now", role)
	}
	return ms[i], nil
}

// settledRoles returns the leader and the sync standby when Patroni names
// both and shows them running: the leader "running", the standby "running"
// (Patroni 3.0) or "streaming" (later versions).
func settledRoles(ms []member) (leader, standby member, ok bool) {
	var haveLeader, haveStandby bool
	for _, m := range ms {
		switch {
		case m.Role == roleLeader && m.State == "running":
			leader, haveLeader = m, true
		case m.Role == roleSyncStandby && (m.State == "running" || m.State == "streaming"):
			standby, haveStandby = m, true
		}
	}
	ok = haveLeader && haveStandby && leader.Port != 0 && standby.Port != 0 && standby.Name != ""
	return leader, standby, ok
}

// leaderView is what the leader's PostgreSQL says of itself and of the sync
// standby Patroni names.
type leaderView struct {
	inRecovery         bool
	syncStandbyNames   string // synchronous_standby_names
	standbyStreamsSync bool   // pg_stat_replication: streaming, sync_state sync
}

const leaderQuery = `
SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       EXISTS (SELECT 1 FROM pg_stat_replication
               WHERE application_name = $1 AND state = 'streaming' AND sync_state = 'sync')`

// standbyNameSep splits synchronous_standby_names ("pg2", `1 ("pg2")`,
// `ANY 1 (pg1, pg2)`) into its words.
var standbyNameSep = regexp.MustCompile(`[\s,()"]+`)

// problem says why the leader does not serve standby as its synchronous
// standby, or returns "" when it does: it accepts writes, names standby in
// synchronous_standby_names, and standby streams to it as synchronous.
func (v leaderView) problem(standby string) string {
	switch {
	case v.inRecovery:
		return "it is in recovery"
	case standby == "" || !slices.Contains(standbyNameSep.Split(v.syncStandbyNames, -1), standby):
		return fmt.Sprintf("its synchronous_standby_names %q does not name %s", v.syncStandbyNames, standby)
	case !v.standbyStreamsSync:
		return fmt.Sprintf("%s does not stream to it as synchronous", standby)
	}
	return ""
}

// health returns nil when the cluster is settled, as the failover scenarios
// require before each fault (internal/chaos/cluster_test.go, settle):
// Patroni names a running leader and a sync standby (settledRoles), the
// leader's PostgreSQL serves that standby as synchronous (leaderView), and
// the standby's PostgreSQL is in recovery. Otherwise it says what is
// missing. Patroni's word alone lags a fault by up to a loop: right after a
// kill it still shows the dead member as running.
func health(ctx context.Context) error {
	ms, err := members(ctx)
	if err != nil {
		return err
	}
	leader, standby, ok := settledRoles(ms)
	if !ok {
		return errors.New("no running leader with a running sync standby in Patroni's /cluster")
	}
	var v leaderView
	err = query(ctx, leader.Port, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, leaderQuery, standby.Name).Scan(&v.inRecovery, &v.syncStandbyNames, &v.standbyStreamsSync)
	})
	if err != nil {
		return fmt.Errorf("leader %s: %w", leader.Name, err)
	}
	if p := v.problem(standby.Name); p != "" {
		return fmt.Errorf("leader %s: %s", leader.Name, p)
	}
	var inRecovery bool
	err = query(ctx, standby.Port, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
	})
	if err != nil {
		return fmt.Errorf("sync standby %s: %w", standby.Name, err)
	}
	if !inRecovery {
		return fmt.Errorf("sync standby %s is not in recovery", standby.Name)
	}
	return nil
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

// waitHealthy waits up to HA_WAIT for health; on timeout it shows the
// members and the end of every log, and returns an error.
func (c *cluster) waitHealthy(ctx context.Context) error {
	limit, err := c.waitLimit()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	next := time.Now().Add(10 * time.Second)
	for {
		err := health(ctx)
		if err == nil {
			return nil
		}
		now := time.Now()
		if !now.Before(deadline) {
			c.showState(ctx)
			return fmt.Errorf("no leader with a sync standby after %d s (HA_WAIT): %w; the members and logs are above",
				int(limit.Seconds()), err)
		}
		if !now.Before(next) {
			c.say("waiting for a leader and a sync standby (%d s left): %v", int(deadline.Sub(now).Seconds()), err)
			next = now.Add(10 * time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// showState logs the members as Patroni sees them and the last lines of
// every log of the cluster.
func (c *cluster) showState(ctx context.Context) {
	c.say("the members:")
	if ms, err := members(ctx); err != nil {
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
func (c *cluster) ensureDatabase(ctx context.Context) error {
	leader, err := roleMember(ctx, roleLeader)
	if err != nil {
		return err
	}
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
