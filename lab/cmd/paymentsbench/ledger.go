package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// ledger is the client's own book of a scenario: what it deposited, and for
// every charge key the outcome the service gave. From it follows what each
// balance must be.
type ledger struct {
	mu       sync.Mutex
	deposits map[string]int64 // account id → money deposited
	keys     map[string]*keyRecord
}

// keyRecord is what the service answered for one Idempotency-Key.
type keyRecord struct {
	req       chargeRequest
	status    int      // the first final status; 0 while none came
	charge    string   // the Location of the charge a 201 created
	anomalies []string // answers that contradict the first final one
}

func newLedger() *ledger {
	return &ledger{deposits: make(map[string]int64), keys: make(map[string]*keyRecord)}
}

// deposit records money that reached account.
func (l *ledger) deposit(account string, amount int64) {
	l.mu.Lock()
	l.deposits[account] += amount
	l.mu.Unlock()
}

// record notes the service's answer to req. Every final answer for a key must
// repeat the first one: the same status and, for a 201, the same charge. A
// different charge for one key means the money moved twice.
func (l *ledger) record(req chargeRequest, a answer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys[req.key]
	if k == nil {
		k = &keyRecord{req: req}
		l.keys[req.key] = k
	}
	if !a.final() {
		return
	}
	switch {
	case k.status == 0:
		k.status, k.charge = a.status, a.location
	case a.status != k.status:
		k.anomalies = append(k.anomalies, fmt.Sprintf("answered %d, then %d", k.status, a.status))
	case a.status == http.StatusCreated && a.location != k.charge:
		k.anomalies = append(k.anomalies, fmt.Sprintf("created two charges: %s and %s", k.charge, a.location))
	}
}

// unsettled returns the charges that never got a final answer.
func (l *ledger) unsettled() []chargeRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	var reqs []chargeRequest
	for _, k := range l.keys {
		if k.status == 0 {
			reqs = append(reqs, k.req)
		}
	}
	return reqs
}

// mismatch is an account whose balance is not what the ledger says.
type mismatch struct {
	account          string
	expected, actual int64
}

func (m mismatch) String() string {
	return fmt.Sprintf("%s: balance %d, want %d (deposits − succeeded charges); off by %d",
		m.account, m.actual, m.expected, m.actual-m.expected)
}

// verdict is the outcome of checking the balances against the ledger.
type verdict struct {
	accounts   int        // accounts checked
	keys       int        // distinct charge keys sent
	succeeded  int        // keys whose charge succeeded (201)
	unsettled  int        // keys with no final answer even after settling
	mismatches []mismatch // balances that differ from deposits − succeeded charges
	anomalies  []string   // keys whose answers contradict each other
}

// ok reports whether every balance matched and every key answered
// consistently.
func (v verdict) ok() bool {
	return v.unsettled == 0 && len(v.mismatches) == 0 && len(v.anomalies) == 0
}

// problems lists what went wrong, one line each, sorted.
func (v verdict) problems() []string {
	var out []string
	for _, m := range v.mismatches {
		out = append(out, m.String())
	}
	out = append(out, v.anomalies...)
	if v.unsettled > 0 {
		out = append(out, fmt.Sprintf("%d keys never got a final answer, so their balances cannot be checked", v.unsettled))
	}
	return out
}

// verify compares the balances read from the service with the ledger: each
// account must hold its deposits minus the amounts of the distinct keys whose
// charge succeeded (a card charge's key is only checked for one final answer). Accounts in balances that the ledger never funded are
// checked too (they must hold nothing but their charges' debits).
func (l *ledger) verify(balances map[string]int64) verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	expected := make(map[string]int64, len(l.deposits))
	for account, amount := range l.deposits {
		expected[account] = amount
	}
	v := verdict{keys: len(l.keys)}
	for key, k := range l.keys {
		switch k.status {
		case 0:
			v.unsettled++
		case http.StatusCreated:
			v.succeeded++
			if k.req.account != "" { // a card charge debits no account of ours
				expected[k.req.account] -= k.req.amount
			}
		}
		for _, a := range k.anomalies {
			v.anomalies = append(v.anomalies, fmt.Sprintf("key %s: %s", key, a))
		}
	}
	for account := range balances {
		if _, ok := expected[account]; !ok {
			expected[account] = 0
		}
	}
	for account, want := range expected {
		v.accounts++
		got, ok := balances[account]
		if !ok {
			v.anomalies = append(v.anomalies, fmt.Sprintf("account %s: balance not read", account))
			continue
		}
		if got != want {
			v.mismatches = append(v.mismatches, mismatch{account: account, expected: want, actual: got})
		}
	}
	slices.SortFunc(v.mismatches, func(a, b mismatch) int { return strings.Compare(a.account, b.account) })
	slices.Sort(v.anomalies)
	return v
}
