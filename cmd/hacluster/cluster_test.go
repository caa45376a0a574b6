package main

import (
	"strings"
	"testing"
)

// clusterJSON is GET /cluster as Patroni answers it, one member per entry.
func clusterJSON(members ...string) string {
	return `{"members": [` + strings.Join(members, ", ") + `], "scope": "payments-ha"}`
}

const (
	leaderPg1  = `{"name": "pg1", "role": "leader", "state": "running", "api_url": "http://127.0.0.1:8441/patroni", "host": "127.0.0.1", "port": 5441, "timeline": 3}`
	syncPg2    = `{"name": "pg2", "role": "sync_standby", "state": "streaming", "api_url": "http://127.0.0.1:8442/patroni", "host": "127.0.0.1", "port": 5442, "timeline": 3, "lag": 0}`
	syncPg2Old = `{"name": "pg2", "role": "sync_standby", "state": "running", "host": "127.0.0.1", "port": 5442, "timeline": 3, "lag": 0}`
)

func TestSettledRoles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		body        string
		wantOK      bool
		wantLeader  string
		wantStandby string
	}{
		{"leader and streaming sync standby", clusterJSON(leaderPg1, syncPg2), true, "pg1", "pg2"},
		{"Patroni 3.0 says running for a streaming standby", clusterJSON(leaderPg1, syncPg2Old), true, "pg1", "pg2"},
		{"order does not matter", clusterJSON(syncPg2, leaderPg1), true, "pg1", "pg2"},
		{"after a switchover", clusterJSON(
			`{"name": "pg1", "role": "sync_standby", "state": "streaming", "port": 5441, "timeline": 4}`,
			`{"name": "pg2", "role": "leader", "state": "running", "port": 5442, "timeline": 4}`), true, "pg2", "pg1"},
		{"no members", clusterJSON(), false, "", ""},
		{"leader alone", clusterJSON(leaderPg1), false, "", ""},
		{"standby only a replica", clusterJSON(leaderPg1,
			`{"name": "pg2", "role": "replica", "state": "streaming", "port": 5442, "timeline": 3}`), false, "", ""},
		{"sync standby stopped", clusterJSON(leaderPg1,
			`{"name": "pg2", "role": "sync_standby", "state": "stopped", "port": 5442}`), false, "", ""},
		{"sync standby starting", clusterJSON(leaderPg1,
			`{"name": "pg2", "role": "sync_standby", "state": "starting", "port": 5442}`), false, "", ""},
		{"leader not running", clusterJSON(
			`{"name": "pg1", "role": "leader", "state": "stopped", "port": 5441, "timeline": 3}`, syncPg2), false, "", ""},
		{"leader still starting", clusterJSON(
			`{"name": "pg1", "role": "leader", "state": "starting", "port": 5441}`, syncPg2), false, "", ""},
		{"leader without a port", clusterJSON(
			`{"name": "pg1", "role": "leader", "state": "running"}`, syncPg2), false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ms, err := parseCluster(strings.NewReader(tt.body))
			if err != nil {
				t.Fatalf("parseCluster: %v", err)
			}
			leader, standby, ok := settledRoles(ms)
			if ok != tt.wantOK {
				t.Fatalf("settledRoles ok = %v, want %v (leader %+v, standby %+v)", ok, tt.wantOK, leader, standby)
			}
			if !ok {
				return
			}
			if leader.Name != tt.wantLeader || standby.Name != tt.wantStandby {
				t.Errorf("settledRoles = leader %s, standby %s; want %s, %s", leader.Name, standby.Name, tt.wantLeader, tt.wantStandby)
			}
			wantPort := map[string]int{"pg1": 5441, "pg2": 5442}
			if leader.Port != wantPort[leader.Name] || standby.Port != wantPort[standby.Name] {
				t.Errorf("ports: leader %d, standby %d", leader.Port, standby.Port)
			}
		})
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
	serving := leaderView{syncStandbyNames: `"pg2"`, standbyStreamsSync: true}
	tests := []struct {
		name    string
		view    leaderView
		standby string
		want    string // a word of the problem; "" when settled
	}{
		{"Patroni's quoted name", serving, "pg2", ""},
		{"count and list", leaderView{syncStandbyNames: `1 ("pg2")`, standbyStreamsSync: true}, "pg2", ""},
		{"ANY with two", leaderView{syncStandbyNames: `ANY 1 (pg1, "pg2")`, standbyStreamsSync: true}, "pg2", ""},
		{"in recovery", leaderView{inRecovery: true, syncStandbyNames: `"pg2"`, standbyStreamsSync: true}, "pg2", "recovery"},
		{"names the other member", serving, "pg1", "does not name pg1"},
		{"a prefix is not a name", leaderView{syncStandbyNames: `"pg22"`, standbyStreamsSync: true}, "pg2", "does not name"},
		{"empty setting (strict mode off)", leaderView{syncStandbyNames: "", standbyStreamsSync: true}, "pg2", "does not name"},
		{"empty standby name", leaderView{syncStandbyNames: `1 ()`, standbyStreamsSync: true}, "", "does not name"},
		{"named but not streaming as sync", leaderView{syncStandbyNames: `"pg2"`}, "pg2", "does not stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.view.problem(tt.standby)
			if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
				t.Errorf("problem(%q) = %q, want %q", tt.standby, got, tt.want)
			}
		})
	}
}
