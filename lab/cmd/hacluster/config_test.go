package main

import (
	"bytes"
	"os"
	"path/filepath"
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
	for _, s := range specs {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			out, err := render(string(tmpl), memberVars("/srv/ha", s))
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			port := map[string]string{"pg1": "1", "pg2": "2", "pg3": "3"}[s.name]
			for _, want := range []string{
				"\nname: " + s.name + "\n",
				"listen: 127.0.0.1:844" + port + "\n",
				"listen: 127.0.0.1:544" + port + "\n",
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
	out, err := render(string(tmpl), map[string]string{"HA_DIR": "/srv/ha"})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	if !strings.Contains(out, "data-dir: /srv/ha/etcd\n") {
		t.Errorf("rendered etcd.yml has no data-dir in /srv/ha:\n%s", out)
	}
	// The ports hacluster waits on and checks are the template's.
	for _, port := range []string{":23790\n", ":23800\n"} {
		if !strings.Contains(out, port) {
			t.Errorf("rendered etcd.yml does not use %q", port)
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
	c, err := newCluster(env("", ""), &bytes.Buffer{})
	if err != nil || c.dir != "/var/tmp/payments-ha" {
		t.Fatalf("default HA_DIR: %v, %v", c, err)
	}
	if d, err := c.waitLimit(); err != nil || d != 90*time.Second {
		t.Errorf("default HA_WAIT = %v, %v; want 90 s", d, err)
	}
	c, err = newCluster(env("/srv/ha/", "2"), &bytes.Buffer{})
	if err != nil || c.dir != "/srv/ha" {
		t.Fatalf("HA_DIR /srv/ha/: %+v, %v", c, err)
	}
	if d, err := c.waitLimit(); err != nil || d != 2*time.Second {
		t.Errorf("HA_WAIT 2 = %v, %v", d, err)
	}
	for _, dir := range []string{"ha", "./ha", "/", "//"} {
		if _, err := newCluster(env(dir, ""), &bytes.Buffer{}); err == nil {
			t.Errorf("HA_DIR %q accepted; down would delete it", dir)
		}
	}
	for _, wait := range []string{"soon", "-1", "1.5"} {
		c, _ := newCluster(env("/srv/ha", wait), &bytes.Buffer{})
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
	return &cluster{dir: filepath.Join(t.TempDir(), "ha"), log: &log}, &log
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
