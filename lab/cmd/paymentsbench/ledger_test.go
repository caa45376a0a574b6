package main

import (
	"net/http"
	"strings"
	"testing"
)

func TestVerify(t *testing.T) {
	t.Parallel()
	charge := func(key, account string) chargeRequest {
		return chargeRequest{key: key, account: account, amount: 100}
	}
	created := func(loc string) answer { return answer{status: http.StatusCreated, location: loc} }
	replayed := func(loc string) answer {
		return answer{status: http.StatusCreated, location: loc, replayed: true}
	}
	refused := answer{status: http.StatusPaymentRequired, location: ""}
	inUse := answer{status: http.StatusConflict}
	noAnswer := answer{}

	type sent struct {
		req chargeRequest
		ans answer
	}
	tests := []struct {
		name      string
		sent      []sent
		balances  map[string]int64
		ok        bool
		succeeded int
		problem   string // a substring of one of the problems, when not ok
	}{
		{
			name: "every charge once",
			sent: []sent{
				{charge("k1", "a"), created("/c1")},
				{charge("k2", "a"), created("/c2")},
				{charge("k3", "b"), created("/c3")},
			},
			balances: map[string]int64{"a": 800, "b": 900}, ok: true, succeeded: 3,
		},
		{
			name: "replays and waits count once",
			sent: []sent{
				{charge("k1", "a"), inUse},
				{charge("k1", "a"), noAnswer},
				{charge("k1", "a"), created("/c1")},
				{charge("k1", "a"), replayed("/c1")},
				{charge("k1", "a"), replayed("/c1")},
			},
			balances: map[string]int64{"a": 900, "b": 1000}, ok: true, succeeded: 1,
		},
		{
			name: "a refused charge moves no money",
			sent: []sent{
				{charge("k1", "a"), refused},
				{charge("k1", "a"), answer{status: http.StatusPaymentRequired, replayed: true}},
			},
			balances: map[string]int64{"a": 1000, "b": 1000}, ok: true,
		},
		{
			name:     "double charge: the balance is short by one amount",
			sent:     []sent{{charge("k1", "a"), created("/c1")}, {charge("k1", "a"), replayed("/c1")}},
			balances: map[string]int64{"a": 800, "b": 1000}, succeeded: 1,
			problem: "a: balance 800, want 900 (deposits − succeeded charges); off by -100",
		},
		{
			name:     "lost charge: the balance is too high",
			sent:     []sent{{charge("k1", "b"), created("/c1")}},
			balances: map[string]int64{"a": 1000, "b": 1000}, succeeded: 1,
			problem: "b: balance 1000, want 900",
		},
		{
			name:     "a retry that creates a second charge",
			sent:     []sent{{charge("k1", "a"), created("/c1")}, {charge("k1", "a"), created("/c2")}},
			balances: map[string]int64{"a": 900, "b": 1000}, succeeded: 1,
			problem: "key k1: created two charges: /c1 and /c2",
		},
		{
			name:     "a retry that answers differently",
			sent:     []sent{{charge("k1", "a"), created("/c1")}, {charge("k1", "a"), refused}},
			balances: map[string]int64{"a": 900, "b": 1000}, succeeded: 1,
			problem: "key k1: answered 201, then 402",
		},
		{
			name:     "a key that never got a final answer",
			sent:     []sent{{charge("k1", "a"), inUse}},
			balances: map[string]int64{"a": 1000, "b": 1000},
			problem:  "1 keys never got a final answer",
		},
		{
			name:     "an account whose balance was not read",
			balances: map[string]int64{"a": 1000},
			problem:  "account b: balance not read",
		},
		{
			name:     "an account the ledger never funded must hold nothing",
			balances: map[string]int64{"a": 1000, "b": 1000, "c": 5},
			problem:  "c: balance 5, want 0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			led := newLedger()
			led.deposit("a", 600)
			led.deposit("a", 400)
			led.deposit("b", 1000)
			for _, s := range tt.sent {
				led.record(s.req, s.ans)
			}
			v := led.verify(tt.balances)
			if v.ok() != tt.ok {
				t.Fatalf("ok() = %t, want %t; problems: %q", v.ok(), tt.ok, v.problems())
			}
			if v.succeeded != tt.succeeded {
				t.Errorf("succeeded = %d, want %d", v.succeeded, tt.succeeded)
			}
			if tt.problem != "" && !strings.Contains(strings.Join(v.problems(), "\n"), tt.problem) {
				t.Errorf("problems %q do not mention %q", v.problems(), tt.problem)
			}
		})
	}
}

func TestUnsettled(t *testing.T) {
	t.Parallel()
	led := newLedger()
	pending := chargeRequest{key: "pending", account: "a", amount: 1}
	led.record(pending, answer{status: http.StatusConflict})
	led.record(pending, answer{status: http.StatusServiceUnavailable})
	done := chargeRequest{key: "done", account: "a", amount: 1}
	led.record(done, answer{})
	led.record(done, answer{status: http.StatusCreated, location: "/c"})
	got := led.unsettled()
	if len(got) != 1 || got[0] != pending {
		t.Errorf("unsettled() = %v, want only %v", got, pending)
	}
}
