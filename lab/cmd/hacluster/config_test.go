package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const templates = "../../../deploy/ha"

func TestRenderPatroniTemplate(t *testing.T) {
	t.Parallel()
	tmpl, err := os.ReadFile(filepath.Join(templates, "patroni.yml.in"))
	if err != nil {
		t.Fatal(err)
	}
	moved := ports{pg: 6001, patroni: 7001, etcd: 9001}
	for _, s := range moved.specs() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			out, err := render(string(tmpl), memberVars("/srv/ha", moved, s))
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			port := map[string]string{"pg1": "1", "pg2": "2", "pg3": "3"}[s.name]
			for _, want := range []string{
				"\nname: " + s.name + "\n",
				"listen: 127.0.0.1:700" + port + "\n",
				"listen: 127.0.0.1:600" + port + "\n",
				"hosts: 127.0.0.1:9001\n",
				"data_dir: /srv/ha/" + s.name + "\n",
				"unix_socket_directories: /srv/ha/run\n",
				"log_directory: /srv/ha/log/" + s.name + "\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("rendered %s lacks %q", s.name, want)
				}
			}
			if strings.Contains(out, "@") {
				t.Errorf("rendered %s still holds an @: %q", s.name, out[strings.Index(out, "@")-20:][:40])
			}
		})
	}
}

func TestRenderEtcdTemplate(t *testing.T) {
	t.Parallel()
	tmpl, err := os.ReadFile(filepath.Join(templates, "etcd.yml.in"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := render(string(tmpl), etcdVars("/srv/ha", ports{pg: 6001, patroni: 7001, etcd: 9001}))
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	if !strings.Contains(out, "data-dir: /srv/ha/etcd\n") {
		t.Errorf("rendered etcd.yml has no data-dir in /srv/ha:\n%s", out)
	}
	// The ports hacluster waits on and checks are the template's.
	for _, want := range []string{
		"listen-client-urls: http://127.0.0.1:9001\n",
		"advertise-client-urls: http://127.0.0.1:9001\n",
		"listen-peer-urls: http://127.0.0.1:9011\n",
		"initial-advertise-peer-urls: http://127.0.0.1:9011\n",
		"initial-cluster: payments-ha-etcd=http://127.0.0.1:9011\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered etcd.yml lacks %q", want)
		}
	}
}

func TestRenderRefusesUnfilledPlaceholder(t *testing.T) {
	t.Parallel()
	_, err := render("data: @HA_DIR@/@NAME@\n", map[string]string{"HA_DIR": "/srv/ha"})
	if err == nil || !strings.Contains(err.Error(), "@NAME@") {
		t.Fatalf("render with NAME missing: err = %v, want one naming @NAME@", err)
	}
}

func TestNewCluster(t *testing.T) {
	t.Parallel()
	env := func(dir, wait string) func(string) string {
		return func(k string) string { return map[string]string{"HA_DIR": dir, "HA_WAIT": wait}[k] }
	}
	c, err := newCluster(env("", ""), defaultPorts, &bytes.Buffer{})
	if err != nil || c.dir != "/var/tmp/payments-ha" {
		t.Fatalf("default HA_DIR: %v, %v", c, err)
	}
	if d, err := c.waitLimit(); err != nil || d != 90*time.Second {
		t.Errorf("default HA_WAIT = %v, %v; want 90 s", d, err)
	}
	c, err = newCluster(env("/srv/ha/", "2"), defaultPorts, &bytes.Buffer{})
	if err != nil || c.dir != "/srv/ha" {
		t.Fatalf("HA_DIR /srv/ha/: %+v, %v", c, err)
	}
	if d, err := c.waitLimit(); err != nil || d != 2*time.Second {
		t.Errorf("HA_WAIT 2 = %v, %v", d, err)
	}
	for _, dir := range []string{"ha", "./ha", "/", "//"} {
		if _, err := newCluster(env(dir, ""), defaultPorts, &bytes.Buffer{}); err == nil {
			t.Errorf("HA_DIR %q accepted; down would delete it", dir)
		}
	}
	for _, wait := range []string{"soon", "-1", "1.5"} {
		c, _ := newCluster(env("/srv/ha", wait), defaultPorts, &bytes.Buffer{})
		if _, err := c.waitLimit(); err == nil {
			t.Errorf("HA_WAIT %q accepted", wait)
		}
	}
}

// testCluster is a cluster in a fresh temporary HA_DIR (not yet created),
// run as the current user, logging into the returned buffer.
func testCluster(t *testing.T) (*cluster, *bytes.Buffer) {
	t.Helper()
	var log bytes.Buffer
	return &cluster{dir: filepath.Join(t.TempDir(), "ha"), ports: defaultPorts, log: &log}, &log
}

func TestPrepareThenDown(t *testing.T) {
	t.Parallel()
	c, log := testCluster(t)
	for range 2 { // up twice: the second finds its own HA_DIR
		if err := c.prepare(templates); err != nil {
			t.Fatalf("prepare: %v", err)
		}
	}
	for _, f := range []string{marker, "etcd.yml", "pg1.yml", "pg2.yml", "pg3.yml", "run", "log"} {
		if _, err := os.Stat(c.path(f)); err != nil {
			t.Errorf("after prepare: %v", err)
		}
	}
	pg3, err := os.ReadFile(c.path("pg3.yml"))
	if err != nil || !strings.Contains(string(pg3), "data_dir: "+c.path("pg3")+"\n") {
		t.Errorf("pg3.yml does not put the data in HA_DIR (%v)", err)
	}
	if err := c.down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("HA_DIR still there after down: %v", err)
	}
	if err := c.down(); err != nil {
		t.Fatalf("down again: %v", err)
	}
	if !strings.Contains(log.String(), "ha: down; removed "+c.dir+"\n") || !strings.Contains(log.String(), "ha: down; nothing in "+c.dir+"\n") {
		t.Errorf("log:\n%s", log)
	}
}

func TestForeignDirectoryIsLeftAlone(t *testing.T) {
	t.Parallel()
	c, _ := testCluster(t)
	precious := c.path("precious")
	if err := os.MkdirAll(c.dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(precious, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.prepare(templates); err == nil || !strings.Contains(err.Error(), "was not made by hacluster") {
		t.Errorf("prepare in a foreign HA_DIR: err = %v", err)
	}
	if err := c.down(); err == nil || !strings.Contains(err.Error(), "not removing it") {
		t.Errorf("down in a foreign HA_DIR: err = %v", err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Errorf("a file of the foreign HA_DIR is gone: %v", err)
	}
	if _, err := os.Stat(c.path("pg1.yml")); err == nil {
		t.Error("prepare wrote into a foreign HA_DIR")
	}
}

func TestReadPorts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    ports
		wantErr string // a word of the error; "" when valid
	}{
		{"defaults", nil, ports{pg: 5441, patroni: 8441, etcd: 23790}, ""},
		{"empty is the default", map[string]string{"HA_PG_PORT": ""}, defaultPorts, ""},
		{"all moved", map[string]string{"HA_PG_PORT": "5451", "HA_PATRONI_PORT": "8451", "HA_ETCD_PORT": "23890"},
			ports{pg: 5451, patroni: 8451, etcd: 23890}, ""},
		{"one moved", map[string]string{"HA_PATRONI_PORT": "9441"}, ports{pg: 5441, patroni: 9441, etcd: 23790}, ""},
		{"not a number", map[string]string{"HA_PG_PORT": "five"}, ports{}, "HA_PG_PORT must be a port number"},
		{"privileged", map[string]string{"HA_ETCD_PORT": "80"}, ports{}, "the etcd client would listen on 80"},
		{"last member past 65535", map[string]string{"HA_PATRONI_PORT": "65534"}, ports{}, "Patroni REST API of pg3 would listen on 65536"},
		{"etcd peer past 65535", map[string]string{"HA_ETCD_PORT": "65530"}, ports{}, "etcd peer would listen on 65540"},
		{"PostgreSQL over Patroni", map[string]string{"HA_PG_PORT": "8440"}, ports{},
			"port 8441 would be both the Patroni REST API of pg1 and the PostgreSQL of pg2"},
		{"etcd peer over PostgreSQL", map[string]string{"HA_ETCD_PORT": "5432"}, ports{},
			"port 5442 would be both the PostgreSQL of pg2 and the etcd peer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := readPorts(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("readPorts = %v, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("readPorts = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// The default ports are the ones the docs, the CI and every caller knew
// before they could move: 5441-5443, 8441-8443, 23790 and 23800.
func TestDefaultPorts(t *testing.T) {
	t.Parallel()
	var got []string
	for _, l := range defaultPorts.listeners() {
		got = append(got, fmt.Sprintf("%s %d", l.what, l.port))
	}
	want := []string{"PostgreSQL of pg1 5441", "Patroni REST API of pg1 8441", "PostgreSQL of pg2 5442",
		"Patroni REST API of pg2 8442", "PostgreSQL of pg3 5443", "Patroni REST API of pg3 8443",
		"etcd client 23790", "etcd peer 23800"}
	if !slices.Equal(got, want) {
		t.Errorf("default listeners = %q, want %q", got, want)
	}
	if got, want := defaultPorts.databaseURL(), "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442,127.0.0.1:5443/payments?sslmode=disable&target_session_attrs=read-write"; got != want {
		t.Errorf("default URL = %q, want %q", got, want)
	}
	if got, want := defaultPorts.patroniURLs(), "http://127.0.0.1:8441,http://127.0.0.1:8442,http://127.0.0.1:8443"; got != want {
		t.Errorf("default REST APIs = %q, want %q", got, want)
	}
}

// Two clusters run side by side when no port of one is a port of the other:
// the second cluster the docs suggest (lab/README.md, docs/operations.md)
// shares none with the first, and one moved by too little is caught.
func TestTwoClustersClash(t *testing.T) {
	t.Parallel()
	second, err := readPorts(func(k string) string {
		return map[string]string{"HA_PG_PORT": "5451", "HA_PATRONI_PORT": "8451", "HA_ETCD_PORT": "23890"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := defaultPorts.clashes(second); len(c) > 0 {
		t.Errorf("the documented second cluster clashes with the first: %q", c)
	}
	if c := second.clashes(defaultPorts); len(c) > 0 {
		t.Errorf("the first cluster clashes with the documented second: %q", c)
	}
	if c := defaultPorts.clashes(defaultPorts); len(c) != len(defaultPorts.listeners()) {
		t.Errorf("two clusters on the same ports clash on %d ports, want all %d: %q", len(c), len(defaultPorts.listeners()), c)
	}
	near := ports{pg: 5443, patroni: 8451, etcd: 23800}
	want := []string{
		"port 5443 would be both the PostgreSQL of pg3 of one and the PostgreSQL of pg1 of the other",
		"port 23800 would be both the etcd peer of one and the etcd client of the other",
	}
	if c := defaultPorts.clashes(near); !slices.Equal(c, want) {
		t.Errorf("clashes = %q, want %q", c, want)
	}
}

// url and api answer from the ports alone, as make reads them while it
// parses; both follow the variables.
func TestRunPrintsURLAndAPIOfItsPorts(t *testing.T) {
	t.Parallel()
	env := func(k string) string {
		return map[string]string{"HA_PG_PORT": "5451", "HA_PATRONI_PORT": "8451", "HA_DIR": "relative, but not needed"}[k]
	}
	for cmd, want := range map[string]string{
		"url": "postgres://postgres@127.0.0.1:5451,127.0.0.1:5452,127.0.0.1:5453/payments?sslmode=disable&target_session_attrs=read-write\n",
		"api": "http://127.0.0.1:8451,http://127.0.0.1:8452,http://127.0.0.1:8453\n",
	} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{cmd}, env, &out, io.Discard); err != nil || out.String() != want {
			t.Errorf("%s = %q, %v; want %q", cmd, out.String(), err, want)
		}
	}
	bad := func(k string) string { return map[string]string{"HA_ETCD_PORT": "x"}[k] }
	if err := run(context.Background(), []string{"url"}, bad, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "HA_ETCD_PORT") {
		t.Errorf("url with HA_ETCD_PORT=x: %v, want an error naming it", err)
	}
}

// A command on an HA_DIR whose cluster was started on other ports refuses,
// saying which: it would talk to another cluster, or to none.
func TestRecordedPortsMustMatch(t *testing.T) {
	t.Parallel()
	c, _ := testCluster(t)
	if err := c.checkRecordedPorts(); err != nil {
		t.Fatalf("before up: %v", err)
	}
	if err := c.prepare(templates); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if err := c.checkRecordedPorts(); err != nil {
		t.Errorf("the same ports: %v", err)
	}
	moved := *c
	moved.ports.pg = 5451
	err := moved.checkRecordedPorts()
	if err == nil || !strings.Contains(err.Error(), "runs with HA_PG_PORT=5441 HA_PATRONI_PORT=8441 HA_ETCD_PORT=23790, not HA_PG_PORT=5451") {
		t.Errorf("other ports: %v", err)
	}
}
