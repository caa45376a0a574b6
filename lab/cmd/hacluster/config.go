package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// marker marks HA_DIR as made by `up`, so that `down` deletes only that.
const marker = ".payments-ha"

// What hacluster creates in HA_DIR is readable by every user, so that
// `status`, `ctl` and the logs work for a developer who is not postgres;
// nothing in it is secret (trust on loopback, no passwords). PostgreSQL and
// etcd keep their own data directories private.
const (
	dirMode  = 0o755
	fileMode = 0o644
)

// placeholder is how deploy/ha/*.in marks what rendering replaces.
var placeholder = regexp.MustCompile(`@[A-Z_]+@`)

// render replaces each @KEY@ of tmpl with vars[KEY]. It returns an error
// naming a placeholder that vars leaves unfilled.
func render(tmpl string, vars map[string]string) (string, error) {
	pairs := make([]string, 0, 2*len(vars))
	for k, v := range vars {
		pairs = append(pairs, "@"+k+"@", v)
	}
	out := strings.NewReplacer(pairs...).Replace(tmpl)
	if p := placeholder.FindString(out); p != "" {
		return "", fmt.Errorf("placeholder %s left unfilled", p)
	}
	return out, nil
}

// memberVars are the values patroni.yml.in gets for member s of a cluster
// on p.
func memberVars(dir string, p ports, s spec) map[string]string {
	return map[string]string{
		"HA_DIR":    dir,
		"NAME":      s.name,
		"PG_PORT":   strconv.Itoa(s.pgPort),
		"API_PORT":  strconv.Itoa(s.apiPort),
		"ETCD_PORT": strconv.Itoa(p.etcd),
	}
}

// etcdVars are the values etcd.yml.in gets for a cluster on p.
func etcdVars(dir string, p ports) map[string]string {
	return map[string]string{
		"HA_DIR":         dir,
		"ETCD_PORT":      strconv.Itoa(p.etcd),
		"ETCD_PEER_PORT": strconv.Itoa(p.etcdPeer()),
	}
}

// portsFile, in HA_DIR, records the ports `up` started the cluster on, as
// ports.String writes them.
const portsFile = "ports"

// checkRecordedPorts returns an error when HA_DIR holds a cluster started
// on other ports than c's: its commands would talk to another cluster, or
// to none.
func (c *cluster) checkRecordedPorts() error {
	data, err := os.ReadFile(c.path(portsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the cluster's ports: %w", err)
	}
	if recorded := strings.TrimSpace(string(data)); recorded != c.ports.String() {
		return fmt.Errorf("the cluster in %s runs with %s, not %s: set those (or choose another HA_DIR)", c.dir, recorded, c.ports)
	}
	return nil
}

// templateDir finds deploy/ha: beside the binary's bin/ (scripts/ha.sh
// builds it into the repository's bin/), or in the working directory (go
// run ./lab/cmd/hacluster from the repository's root).
func templateDir() (string, error) {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Join(filepath.Dir(exe), "..", "deploy", "ha"))
	}
	dirs = append(dirs, filepath.Join("deploy", "ha"))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "patroni.yml.in")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no deploy/ha/patroni.yml.in beside bin/ nor in the working directory: run scripts/ha.sh")
}

// renderFile renders the template src into the file name of root (vars as
// in render).
func renderFile(root *os.Root, src, name string, vars map[string]string) error {
	tmpl, err := os.ReadFile(src) //nolint:gosec // G304: a template in the repository's deploy/ha
	if err != nil {
		return err
	}
	out, err := render(string(tmpl), vars)
	if err != nil {
		return fmt.Errorf("render %s: %w", src, err)
	}
	return root.WriteFile(name, []byte(out), fileMode)
}

// prepare creates HA_DIR (owned by postgres, marked as ours so that `down`
// deletes only what `up` made) and renders the configuration from the
// templates in tmpl (deploy/ha) into it. It returns an error when HA_DIR
// exists without the marker.
func (c *cluster) prepare(tmpl string) error {
	if _, err := os.Stat(c.dir); err == nil {
		if _, err := os.Stat(c.path(marker)); err != nil {
			return fmt.Errorf("%s exists and was not made by hacluster (no %s in it); choose another HA_DIR", c.dir, marker)
		}
	}
	if err := os.MkdirAll(c.dir, dirMode); err != nil {
		return fmt.Errorf("create HA_DIR: %w", err)
	}
	root, err := os.OpenRoot(c.dir)
	if err != nil {
		return fmt.Errorf("open HA_DIR: %w", err)
	}
	defer root.Close()
	if err := root.WriteFile(marker, nil, fileMode); err != nil {
		return fmt.Errorf("mark HA_DIR: %w", err)
	}
	if err := root.WriteFile(portsFile, []byte(c.ports.String()+"\n"), fileMode); err != nil {
		return fmt.Errorf("record the ports: %w", err)
	}
	for _, d := range []string{"run", "log"} {
		if err := root.MkdirAll(d, dirMode); err != nil {
			return fmt.Errorf("create HA_DIR: %w", err)
		}
	}
	if err := renderFile(root, filepath.Join(tmpl, "etcd.yml.in"), "etcd.yml", etcdVars(c.dir, c.ports)); err != nil {
		return err
	}
	for _, s := range c.ports.specs() {
		if err := renderFile(root, filepath.Join(tmpl, "patroni.yml.in"), s.name+".yml", memberVars(c.dir, c.ports, s)); err != nil {
			return err
		}
	}
	if len(c.asPostgres) == 0 {
		return nil
	}
	return chownTree(root, "postgres")
}

// chownTree gives everything in root, root included, to the OS user name
// and its group.
func chownTree(root *os.Root, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("look up OS user %s: %w", name, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return fmt.Errorf("uid of %s: %w", name, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return fmt.Errorf("gid of %s: %w", name, err)
	}
	// A running PostgreSQL may remove a file (a recycled WAL segment) while
	// the walk passes: what is gone needs no owner.
	return fs.WalkDir(root.FS(), ".", func(path string, _ fs.DirEntry, err error) error {
		if err == nil {
			err = root.Lchown(path, uid, gid)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	})
}
