package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestHelpSucceeds: every command's -h prints its usage to stdout, nothing to
// stderr, and succeeds (exit status 0), without touching a database.
func TestHelpSucceeds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the usage's first line
	}{
		{[]string{"-h"}, "usage:"},
		{[]string{"help"}, "usage:"},
		{[]string{"serve", "-h"}, "usage: payments serve [flags]"},
		{[]string{"serve", "--help"}, "usage: payments serve [flags]"},
		{[]string{"relay", "-h"}, "usage: payments relay [flags]"},
		{[]string{"consume", "-h"}, "usage: payments consume [flags]"},
		{[]string{"migrate", "-h"}, "usage:"},
		{[]string{"migrate", "up", "-h"}, "usage: payments migrate up [flags]"},
		{[]string{"migrate", "force", "-h"}, "usage: payments migrate force VERSION [flags]"},
		{[]string{"merchants", "-h"}, "usage:"},
		{[]string{"merchants", "create", "-h"}, "usage: payments merchants create --name NAME [flags]"},
		{[]string{"merchants", "list", "-h"}, "usage: payments merchants list [--limit N] [--starting-after MERCHANT_ID] [flags]"},
		{[]string{"api-keys", "--help"}, "usage:"},
		{[]string{"api-keys", "list", "-h"}, "usage: payments api-keys list --merchant ID [flags]"},
		{[]string{"api-keys", "revoke", "-h"}, "usage: payments api-keys revoke KEY_ID [flags]"},
		{[]string{"charges", "-h"}, "usage:"},
		{[]string{"charges", "resolve", "-h"}, "usage: payments charges resolve CHARGE_ID --as succeeded|failed --reason TEXT --operator NAME [flags]"},
		{[]string{"charges", "resolve", "ch_0123456789abcdef0123456789abcdef", "--help"},
			"usage: payments charges resolve CHARGE_ID --as succeeded|failed --reason TEXT --operator NAME [flags]"},
		{[]string{"healthcheck", "-h"}, "usage: payments healthcheck [flags]"},
		{[]string{"version", "-h"}, "usage: payments version [--json]"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := envOf(map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"})
			if err := run(context.Background(), tc.args, env, &stdout, &stderr); err != nil {
				t.Errorf("run = %v, want nil (exit status 0)", err)
			}
			if first, _, _ := strings.Cut(stdout.String(), "\n"); first != tc.want {
				t.Errorf("stdout starts %q, want %q:\n%s", first, tc.want, stdout.String())
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr: %q, want nothing", stderr.String())
			}
		})
	}
}

// TestServeHelpShowsTypes: serve -h gives each setting's type and default, and
// the default is the environment's value where one is set.
func TestServeHelpShowsTypes(t *testing.T) {
	var stdout bytes.Buffer
	env := envOf(map[string]string{"IDEMPOTENCY_TTL": "48h"})
	if err := run(context.Background(), []string{"serve", "-h"}, env, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	help := stdout.String()
	for _, want := range []string{
		"  --idempotency-ttl duration\n    \thow long keys and their responses are kept, counted from when the\n" +
			"    \tresponse is stored; refused below 1h ($IDEMPOTENCY_TTL) (default 48h)\n",
		"  --idempotency-cache-bytes size\n",
		"  --db-max-conns int\n",
		"  --relay bool\n",
		"  --database-url url\n",
		"  --http-addr address\n",
		"  --log-level level\n",
		"  --metrics-sample duration\n",
		"  --pprof-addr address\n    \taddress of a listener serving Go's profiler (/debug/pprof/), for\n" +
			"    \tperformance work; empty: none. Keep it on loopback ($PPROF_ADDR)\n",
		"\nConnections and waits:\n  --db-max-conns int\n",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("serve -h lacks %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, " string\n") {
		t.Errorf("serve -h still shows a setting as a string:\n%s", help)
	}
}

// TestFlagsOverrideTheEnvironment: a flag wins over its variable, whatever its
// type; a bad flag is blamed on the flag, a bad variable on the variable, and
// a flag the command lacks prints the usage to stderr and fails.
func TestFlagsOverrideTheEnvironment(t *testing.T) {
	env := envOf(map[string]string{"IDEMPOTENCY_TTL": "3h", "RELAY_ENABLED": "true", "IDEMPOTENCY_CACHE_BYTES": "2MiB", "JANITOR_BATCH": "5"})
	cfg, err := loadConfig("serve", []string{"--idempotency-ttl", "2h", "--relay", "false", "--idempotency-cache-bytes", "1MiB"},
		env, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Keys.TTL != 2*time.Hour || cfg.Parts.Relay || cfg.Keys.CacheBytes != 1<<20 || cfg.Keys.JanitorBatch != 5 {
		t.Errorf("ttl %s, relay %t, cache bytes %d, janitor batch %d; want 2h, false, 1048576, 5 (the variable)",
			cfg.Keys.TTL, cfg.Parts.Relay, cfg.Keys.CacheBytes, cfg.Keys.JanitorBatch)
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--relay", "maybe"}, `invalid --relay: want true or false, got "maybe"`},
		{nil, []string{"--relay-enabled", "maybe"}, `invalid --relay-enabled: want true or false, got "maybe"`},
		{nil, []string{"--log-level", "verbose"}, `invalid --log-level: want debug, info, warn or error, got "verbose"`},
		{map[string]string{"ACCESS_LOG": "loud"}, nil, `invalid ACCESS_LOG: want info, debug or off, got "loud"`},
		{map[string]string{"ACCESS_LOG_SAMPLE": "0"}, nil, `invalid ACCESS_LOG_SAMPLE: want a share from 0.001 to 1, got "0"`},
		{map[string]string{"DATABASE_URL": "mysql://payments@db/payments"}, nil,
			`invalid DATABASE_URL: want a postgres:// (or postgresql://) URL or key=value settings, got a mysql:// URL`},
		{map[string]string{"RELAY_ENABLED": "maybe"}, nil, `invalid RELAY_ENABLED: want true or false, got "maybe"`},
		{nil, []string{"--idempotency-cache-bytes", "1MB"}, "invalid --idempotency-cache-bytes: want a size in bytes"},
		{nil, []string{"--janitor-batch", "0"}, `invalid --janitor-batch: want a positive integer, got "0"`},
	} {
		if _, err := loadConfig("serve", tc.args, envOf(tc.env), io.Discard, io.Discard); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want %q", tc.env, tc.args, err, tc.want)
		}
	}

	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"serve", "--no-such-flag"}, envOf(nil), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("serve --no-such-flag = %v, want an error naming the flag", err)
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "payments serve -h") || strings.Count(stderr.String(), "\n") > 3 {
		t.Errorf("stdout %q; stderr %q; want on stderr only a short line naming the flag and where the settings are listed", stdout.String(), stderr.String())
	}
	cfg, err = loadConfig("serve", nil, envOf(map[string]string{"ACCESS_LOG": "debug", "ACCESS_LOG_SAMPLE": "0.25"}), io.Discard, io.Discard)
	if a := cfg.HTTP.AccessLog; err != nil || a.Level != slog.LevelDebug || a.Sample != 0.25 || a.Off {
		t.Errorf("ACCESS_LOG=debug ACCESS_LOG_SAMPLE=0.25: %+v, %v", a, err)
	}
	// The flag of RELAY_ENABLED is named after it; --relay, its former
	// name, still works.
	for _, flagName := range []string{"--relay-enabled", "--relay"} {
		cfg, err := loadConfig("serve", []string{flagName, "false"}, envOf(nil), io.Discard, io.Discard)
		if err != nil || cfg.Parts.Relay {
			t.Errorf("%s false: relay %t, %v; want it off", flagName, cfg.Parts.Relay, err)
		}
	}
}

// TestHelpHidesPasswords: serve -h shows the environment's URLs as defaults,
// without their passwords.
func TestHelpHidesPasswords(t *testing.T) {
	for env, want := range map[string]string{
		"postgres://payments:s3cret@db:5432/payments?sslmode=disable": "(default postgres://payments:xxxxx@db:5432/payments?sslmode=disable)",
		"postgres://payments@db/payments?password=s3cret":             "(default postgres://payments@db/payments?password=xxxxx)",
		"host=db user=payments password=s3cret":                       "(default (set, not shown))",
	} {
		var stdout bytes.Buffer
		vars := envOf(map[string]string{"DATABASE_URL": env, "NATS_URL": "nats://relay:s3cret@nats:4222"})
		if err := run(context.Background(), []string{"serve", "-h"}, vars, &stdout, io.Discard); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(stdout.String(), "s3cret") || !strings.Contains(stdout.String(), want) ||
			!strings.Contains(stdout.String(), "(default nats://relay:xxxxx@nats:4222)") {
			t.Errorf("DATABASE_URL=%s: serve -h shows\n%s\nwant %s, and no password", env, stdout.String(), want)
		}
	}
}
