package main

import (
	"fmt"
	"strings"
	"testing"
)

// clusterJSON is GET /cluster as Patroni answers it, one member per entry.
func clusterJSON(members ...string) string {
	return `{"members": [` + strings.Join(members, ", ") + `], "scope": "payments-ha"}`
}

const (
	leaderPg1   = `{"name": "pg1", "role": "leader", "state": "running", "api_url": "http://127.0.0.1:8441/patroni", "host": "127.0.0.1", "port": 5441, "timeline": 3}`
	syncPg2     = `{"name": "pg2", "role": "sync_standby", "state": "streaming", "api_url": "http://127.0.0.1:8442/patroni", "host": "127.0.0.1", "port": 5442, "timeline": 3, "lag": 0}`
	syncPg2Old  = `{"name": "pg2", "role": "sync_standby", "state": "running", "host": "127.0.0.1", "port": 5442, "timeline": 3, "lag": 0}`
	replicaPg3  = `{"name": "pg3", "role": "replica", "state": "streaming", "api_url": "http://127.0.0.1:8443/patroni", "host": "127.0.0.1", "port": 5443, "timeline": 3, "lag": 0}`
	replicaPg3O = `{"name": "pg3", "role": "replica", "state": "running", "host": "127.0.0.1", "port": 5443, "timeline": 3, "lag": 0}`
)

func TestSettledRoles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		body        string
		wantErr     string // a word of the error; "" when settled
		wantLeader  string
		wantStandby string
		wantReplica string
	}{
		{"leader, streaming sync standby and replica", clusterJSON(leaderPg1, syncPg2, replicaPg3), "", "pg1", "pg2", "pg3"},
		{"Patroni 3.0 says running for a streaming standby", clusterJSON(leaderPg1, syncPg2Old, replicaPg3O), "", "pg1", "pg2", "pg3"},
		{"order does not matter", clusterJSON(replicaPg3, syncPg2, leaderPg1), "", "pg1", "pg2", "pg3"},
		{"after a failover", clusterJSON(
			`{"name": "pg1", "role": "replica", "state": "streaming", "port": 5441, "timeline": 4}`,
			`{"name": "pg2", "role": "leader", "state": "running", "port": 5442, "timeline": 4}`,
			`{"name": "pg3", "role": "sync_standby", "state": "streaming", "port": 5443, "timeline": 4}`), "", "pg2", "pg3", "pg1"},
		{"no members", clusterJSON(), "no running leader", "", "", ""},
		{"leader alone", clusterJSON(leaderPg1), "no running leader", "", "", ""},
		{"third member missing", clusterJSON(leaderPg1, syncPg2), "0 running replicas in Patroni's /cluster, want 1", "", "", ""},
		{"third member stopped", clusterJSON(leaderPg1, syncPg2,
			`{"name": "pg3", "role": "replica", "state": "stopped", "port": 5443}`), "0 running replicas", "", "", ""},
		{"third member starting", clusterJSON(leaderPg1, syncPg2,
			`{"name": "pg3", "role": "replica", "state": "starting", "port": 5443}`), "0 running replicas", "", "", ""},
		{"no sync standby, two replicas", clusterJSON(leaderPg1,
			`{"name": "pg2", "role": "replica", "state": "streaming", "port": 5442, "timeline": 3}`, replicaPg3), "no running leader", "", "", ""},
		{"sync standby stopped", clusterJSON(leaderPg1,
			`{"name": "pg2", "role": "sync_standby", "state": "stopped", "port": 5442}`, replicaPg3), "no running leader", "", "", ""},
		{"leader not running", clusterJSON(
			`{"name": "pg1", "role": "leader", "state": "stopped", "port": 5441, "timeline": 3}`, syncPg2, replicaPg3), "no running leader", "", "", ""},
		{"leader still starting", clusterJSON(
			`{"name": "pg1", "role": "leader", "state": "starting", "port": 5441}`, syncPg2, replicaPg3), "no running leader", "", "", ""},
		{"leader without a port", clusterJSON(
			`{"name": "pg1", "role": "leader", "state": "running"}`, syncPg2, replicaPg3), "no running leader", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ms, err := parseCluster(strings.NewReader(tt.body))
			if err != nil {
				t.Fatalf("parseCluster: %v", err)
			}
			r, err := settledRoles(ms)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("settledRoles = %v, %v; want an error with %q", r, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("settledRoles: %v", err)
			}
			if r.leader.Name != tt.wantLeader || r.standby.Name != tt.wantStandby || len(r.replicas) != 1 || r.replicas[0].Name != tt.wantReplica {
				t.Errorf("settledRoles = %v; want leader %s, sync standby %s, replica %s", r, tt.wantLeader, tt.wantStandby, tt.wantReplica)
			}
			wantPort := map[string]int{"pg1": 5441, "pg2": 5442, "pg3": 5443}
			if r.leader.Port != wantPort[r.leader.Name] || r.standby.Port != wantPort[r.standby.Name] || r.replicas[0].Port != wantPort[r.replicas[0].Name] {
				t.Errorf("ports: %v", r)
			}
		})
	}
}

func TestRolesString(t *testing.T) {
	t.Parallel()
	ms, err := parseCluster(strings.NewReader(clusterJSON(replicaPg3, leaderPg1, syncPg2)))
	if err != nil {
		t.Fatal(err)
	}
	r, err := settledRoles(ms)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.String(), "leader pg1 5441, sync standby pg2 5442, replica pg3 5443"; got != want {
		t.Errorf("roles = %q, want %q", got, want)
	}
}

func TestParseClusterRejectsGarbage(t *testing.T) {
	t.Parallel()
	if _, err := parseCluster(strings.NewReader("<html>502</html>")); err == nil {
		t.Fatal("parseCluster accepted HTML")
	}
}

func TestMemberString(t *testing.T) {
	t.Parallel()
	ms, err := parseCluster(strings.NewReader(clusterJSON(leaderPg1,
		`{"name": "pg2", "role": "replica", "state": "stopped", "port": 5442}`)))
	if err != nil {
		t.Fatal(err)
	}
	got := []string{ms[0].String(), ms[1].String()}
	want := []string{"pg1\tleader\trunning\t5441\t3", "pg2\treplica\tstopped\t5442\t"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestLeaderViewProblem(t *testing.T) {
	t.Parallel()
	both := map[string]string{"pg2": "streaming/sync", "pg3": "streaming/async"}
	serving := leaderView{syncStandbyNames: `"pg2"`, replication: both}
	pg3 := []string{"pg3"}
	tests := []struct {
		name     string
		view     leaderView
		standby  string
		replicas []string
		want     string // a word of the problem; "" when settled
	}{
		{"Patroni's quoted name", serving, "pg2", pg3, ""},
		{"count and list", leaderView{syncStandbyNames: `1 ("pg2")`, replication: both}, "pg2", pg3, ""},
		{"ANY with two", leaderView{syncStandbyNames: `ANY 1 (pg3, "pg2")`, replication: both}, "pg2", pg3, ""},
		{"the replica a potential sync standby", leaderView{syncStandbyNames: `"pg2"`,
			replication: map[string]string{"pg2": "streaming/sync", "pg3": "streaming/potential"}}, "pg2", pg3, ""},
		{"in recovery", leaderView{inRecovery: true, syncStandbyNames: `"pg2"`, replication: both}, "pg2", pg3, "recovery"},
		{"names another member", serving, "pg3", []string{"pg2"}, "does not name pg3"},
		{"a prefix is not a name", leaderView{syncStandbyNames: `"pg22"`, replication: both}, "pg2", pg3, "does not name"},
		{"empty setting (strict mode off)", leaderView{syncStandbyNames: "", replication: both}, "pg2", pg3, "does not name"},
		{"strict mode with no standby", leaderView{syncStandbyNames: "*", replication: both}, "pg2", pg3, "does not name"},
		{"empty standby name", leaderView{syncStandbyNames: `1 ()`, replication: both}, "", pg3, "does not name"},
		{"named but not streaming as sync", leaderView{syncStandbyNames: `"pg2"`,
			replication: map[string]string{"pg2": "streaming/async", "pg3": "streaming/async"}}, "pg2", pg3, "does not stream to it as synchronous"},
		{"named but catching up", leaderView{syncStandbyNames: `"pg2"`,
			replication: map[string]string{"pg2": "catchup/sync", "pg3": "streaming/async"}}, "pg2", pg3, "does not stream to it as synchronous"},
		{"the replica not connected", leaderView{syncStandbyNames: `"pg2"`,
			replication: map[string]string{"pg2": "streaming/sync"}}, "pg2", pg3, "replica pg3 does not stream"},
		{"the replica catching up", leaderView{syncStandbyNames: `"pg2"`,
			replication: map[string]string{"pg2": "streaming/sync", "pg3": "catchup/async"}}, "pg2", pg3, "replica pg3 does not stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.view.problem(tt.standby, tt.replicas)
			if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
				t.Errorf("problem(%q, %q) = %q, want %q", tt.standby, tt.replicas, got, tt.want)
			}
		})
	}
}

// The DATABASE_URL names every member, so that a new connection finds the
// primary wherever it is.
func TestDatabaseURLNamesEveryMember(t *testing.T) {
	t.Parallel()
	for _, p := range []ports{defaultPorts, {pg: 6001, patroni: 7001, etcd: 9001}} {
		hosts, _, _ := strings.Cut(strings.TrimPrefix(p.databaseURL(), "postgres://postgres@"), "/")
		var want []string
		for _, s := range p.specs() {
			want = append(want, fmt.Sprintf("127.0.0.1:%d", s.pgPort))
		}
		if hosts != strings.Join(want, ",") {
			t.Errorf("databaseURL's hosts = %q, want %q", hosts, strings.Join(want, ","))
		}
		if len(want) != 3 {
			t.Errorf("%d members, want three: losing any one must leave a primary and a synchronous standby", len(want))
		}
	}
}
