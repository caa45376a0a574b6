// Package benchrun holds what the benchmark commands share (lab/cmd/benchrun's
// `make bench`, `bench-sync`, `bench-pair` and `batch-cost`): builds of a
// git revision, the service and NATS as child processes, scratch databases,
// the load generator's runs and their JSON results, pg-reference, the
// service's metrics, keys held or seeded the way another replica or a
// long-lived deployment would leave them, and the arithmetic of the report.
// It measures; it asserts nothing.
package benchrun

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// PositiveInt reads the environment variable name as a whole number of at
// least min, def when it is unset or empty.
func PositiveInt(name string, def, min int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || strings.TrimSpace(v) != v {
		return 0, fmt.Errorf("%s must be a whole number of at least %d, got %q", name, min, v)
	}
	return n, nil
}

// Flag reads the environment variable name as 0 or 1, def when unset.
func Flag(name string, def bool) (bool, error) {
	switch os.Getenv(name) {
	case "":
		return def, nil
	case "0":
		return false, nil
	case "1":
		return true, nil
	}
	return false, fmt.Errorf("%s must be 0 or 1, got %q", name, os.Getenv(name))
}

// Counts reads the environment variable name as positive whole numbers
// separated by spaces ("1 2 4"), def when unset.
func Counts(name, def string) ([]int, error) {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var counts []int
	for _, w := range strings.Fields(v) {
		n, err := strconv.Atoi(w)
		if err != nil || n < 1 {
			counts = nil
			break
		}
		counts = append(counts, n)
	}
	if len(counts) == 0 {
		return nil, fmt.Errorf("%s must be positive whole numbers separated by spaces, got %q", name, v)
	}
	return counts, nil
}

var durationText = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(ms|s)$`)

// Duration reads the environment variable name as a duration like 1s or
// 500ms, kept as its text (it goes into the service's environment as is).
func Duration(name, def string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	if !durationText.MatchString(v) {
		return "", fmt.Errorf("%s must be a duration like 1s or 500ms, got %q", name, v)
	}
	return v, nil
}

// Getenv is os.Getenv with a default for unset or empty.
func Getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// SharedDir finds the directory holding bench/pg-reference: ../shared beside
// the repository, else /work/shared.
func SharedDir() (string, error) {
	for _, dir := range []string{"../shared", "/work/shared"} {
		if info, err := os.Stat(dir + "/bench/pg-reference"); err == nil && info.Mode()&0o111 != 0 {
			return dir, nil
		}
	}
	return "", errors.New("pg-reference not found in ../shared/bench or /work/shared/bench")
}

// RequireTools fails naming the first tool that is not on PATH.
func RequireTools(tools ...string) error {
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s is not installed (psql and pgbench: Debian/Ubuntu package postgresql-client)", t)
		}
	}
	return nil
}

// WithDB is the URL of database name on the server(s) of admin, with
// admin's query kept: postgres://u@h:p,h2:p2/postgres?x=y → .../name?x=y.
func WithDB(admin, name string) string {
	base, query, _ := strings.Cut(admin, "?")
	if i := strings.LastIndex(base, "/"); i > len("postgres://") {
		base = base[:i]
	}
	if query != "" {
		return base + "/" + name + "?" + query
	}
	return base + "/" + name
}

// Redact is url with its password replaced, for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a database URL)"
	}
	return u.Redacted()
}
