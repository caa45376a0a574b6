package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ports is where the cluster listens, on 127.0.0.1: PostgreSQL on pg, pg+1
// and pg+2 (pg1, pg2, pg3), Patroni's REST APIs on patroni to patroni+2, and
// etcd on etcd for its clients and etcd+10 for its peer. HA_PG_PORT,
// HA_PATRONI_PORT and HA_ETCD_PORT move them, so that a second cluster, in
// another HA_DIR, can run beside the first.
type ports struct{ pg, patroni, etcd int }

// defaultPorts: 5441-5443, 8441-8443, 23790 and 23800; etcd's not its usual
// 2379/2380, so as not to meet another etcd.
var defaultPorts = ports{pg: 5441, patroni: 8441, etcd: 23790}

// etcdPeerGap is how far above its client port etcd's peer port is.
const etcdPeerGap = 10

// memberNames are the members, in the order of their ports.
var memberNames = []string{"pg1", "pg2", "pg3"}

// portVars are the variables that move the ports, each the first port of
// its range.
var portVars = []struct {
	name string
	port func(*ports) *int
}{
	{"HA_PG_PORT", func(p *ports) *int { return &p.pg }},
	{"HA_PATRONI_PORT", func(p *ports) *int { return &p.patroni }},
	{"HA_ETCD_PORT", func(p *ports) *int { return &p.etcd }},
}

// readPorts reads HA_PG_PORT, HA_PATRONI_PORT and HA_ETCD_PORT; each one
// unset or empty keeps its default. It returns an error naming the variable
// when one is not a number, when a port would fall outside 1024-65535, or
// when two of the cluster's listeners would share a port.
func readPorts(getenv func(string) string) (ports, error) {
	p := defaultPorts
	for _, v := range portVars {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return ports{}, fmt.Errorf("%s must be a port number, not %q", v.name, s)
		}
		*v.port(&p) = n
	}
	for _, l := range p.listeners() {
		if l.port < 1024 || l.port > 65535 {
			return ports{}, fmt.Errorf("%s: the %s would listen on %d, outside 1024-65535", p, l.what, l.port)
		}
	}
	if shared := p.ownClashes(); len(shared) > 0 {
		return ports{}, fmt.Errorf("%s: %s", p, strings.Join(shared, "; "))
	}
	return p, nil
}

// String is the ports as the variables that set them:
// "HA_PG_PORT=5441 HA_PATRONI_PORT=8441 HA_ETCD_PORT=23790".
func (p ports) String() string {
	fields := make([]string, len(portVars))
	for i, v := range portVars {
		fields[i] = fmt.Sprintf("%s=%d", v.name, *v.port(&p))
	}
	return strings.Join(fields, " ")
}

// listener is one port of the cluster and what listens on it.
type listener struct {
	port int
	what string // "PostgreSQL of pg1", "Patroni REST API of pg1", "etcd client", "etcd peer"
}

// listeners lists every port of the cluster, eight in all.
func (p ports) listeners() []listener {
	var out []listener
	for _, s := range p.specs() {
		out = append(out, listener{s.pgPort, "PostgreSQL of " + s.name}, listener{s.apiPort, "Patroni REST API of " + s.name})
	}
	return append(out, listener{p.etcd, "etcd client"}, listener{p.etcdPeer(), "etcd peer"})
}

// clashes says, one sentence each, where two clusters, on p and on q, would
// listen on the same port: without one they can run side by side.
func (p ports) clashes(q ports) []string {
	var out []string
	for _, a := range p.listeners() {
		for _, b := range q.listeners() {
			if a.port == b.port {
				out = append(out, fmt.Sprintf("port %d would be both the %s of one and the %s of the other", a.port, a.what, b.what))
			}
		}
	}
	return out
}

// ownClashes says, one sentence each, where two listeners of one cluster
// on p would share a port.
func (p ports) ownClashes() []string {
	var out []string
	ls := p.listeners()
	for i, a := range ls {
		for _, b := range ls[i+1:] {
			if a.port == b.port {
				out = append(out, fmt.Sprintf("port %d would be both the %s and the %s", a.port, a.what, b.what))
			}
		}
	}
	return out
}

// specs are the members and their ports.
func (p ports) specs() []spec {
	out := make([]spec, len(memberNames))
	for i, name := range memberNames {
		out[i] = spec{name: name, pgPort: p.pg + i, apiPort: p.patroni + i}
	}
	return out
}

// etcdPeer is etcd's peer port.
func (p ports) etcdPeer() int { return p.etcd + etcdPeerGap }

// databaseURL names every member: libpq and pgx try them in order and keep
// the first that accepts writes, so a new connection finds the primary
// wherever it is now.
func (p ports) databaseURL() string {
	hosts := make([]string, len(memberNames))
	for i, s := range p.specs() {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(s.pgPort)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/payments?sslmode=disable&target_session_attrs=read-write"
}

// patroniURLs are the members' REST API base URLs, comma-separated, as
// internal/chaos reads them from PAYMENTS_HA_PATRONI.
func (p ports) patroniURLs() string {
	urls := make([]string, len(memberNames))
	for i, s := range p.specs() {
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(s.apiPort)
	}
	return strings.Join(urls, ",")
}

// apiPorts lists the members' REST API ports, "8441, 8442, 8443".
func (p ports) apiPorts() string {
	out := make([]string, len(memberNames))
	for i, s := range p.specs() {
		out[i] = strconv.Itoa(s.apiPort)
	}
	return strings.Join(out, ", ")
}

// lookupSpec returns the member called name, or an error naming the members.
func (p ports) lookupSpec(name string) (spec, error) {
	specs := p.specs()
	if i := slices.IndexFunc(specs, func(s spec) bool { return s.name == name }); i >= 0 {
		return specs[i], nil
	}
	return spec{}, fmt.Errorf("unknown member %q (pg1, pg2 or pg3)", name)
}
