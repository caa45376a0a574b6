package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every setting of every command, in the order -h lists them.
var (
	databaseVars = []string{"DATABASE_URL"}
	poolVars     = []string{"DB_MAX_CONNS", "IDEMPOTENCY_WAIT", "COMMIT_WAIT"}
	serveVars    = slices.Concat(databaseVars, poolVars, []string{"HTTP_ADDR", "TRUSTED_PROXIES", "RATE_LIMIT_READS", "RATE_LIMIT_WRITES", "ACCESS_LOG", "ACCESS_LOG_SAMPLE", "SHUTDOWN_DELAY", "SHUTDOWN_TIMEOUT",
		"IDEMPOTENCY_TTL", "IDEMPOTENCY_CACHE_SIZE", "IDEMPOTENCY_CACHE_BYTES", "JANITOR_INTERVAL", "JANITOR_BATCH",
		"CHARGE_BATCH_SIZE", "CHARGE_BATCHES", "CHARGE_AUTHORIZATION_TTL", "CHARGE_EXPIRY_INTERVAL",
		"PROCESSOR", "PROCESSOR_URL", "PROCESSOR_WAIT", "PROCESSOR_TIMEOUT", "PROCESSOR_DECISION_DEADLINE", "PROCESSOR_WEBHOOK_SECRET",
		"STRIPE_API_KEY", "STRIPE_API_BASE", "STRIPE_ACCOUNT", "STRIPE_WEBHOOK_SECRET", "RECOVERY_INTERVAL",
		"RELAY_ENABLED", "WEBHOOK_DELIVERY", "PPROF_ADDR", "NATS_URL", "RELAY_BATCH", "RELAY_POLL", "EVENT_RETENTION",
		"WEBHOOK_ALLOW_PRIVATE_NETWORKS", "METRICS_ADDR", "METRICS_SAMPLE", "EVENTS_HELD_WARN", "LOG_LEVEL"})
)

// TestEachCommandListsItsSettings: -h lists the settings the command reads,
// room by room, and no other; a command that reads none lists none.
func TestEachCommandListsItsSettings(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		vars  []string
		rooms []string
	}{
		{[]string{"serve"}, serveVars, []string{"Database", "Connections and waits", "HTTP API", "Shutdown", "Idempotency keys",
			"Charges", "Card processor", "Serve's parts", "NATS", "Outbox relay", "Webhooks", "Metrics", "Outbox monitoring", "Logging"}},
		{[]string{"relay"}, slices.Concat(databaseVars, poolVars, []string{"NATS_URL", "RELAY_BATCH", "RELAY_POLL", "EVENT_RETENTION", "METRICS_ADDR", "LOG_LEVEL"}),
			[]string{"Database", "Connections and waits", "NATS", "Outbox relay", "Metrics", "Logging"}},
		{[]string{"consume"}, slices.Concat(databaseVars, poolVars, []string{"NATS_URL", "METRICS_ADDR", "LOG_LEVEL"}),
			[]string{"Database", "Connections and waits", "NATS", "Metrics", "Logging"}},
		{[]string{"migrate", "up"}, slices.Concat(databaseVars, poolVars, []string{"MIGRATE_WAIT"}), []string{"Database", "Connections and waits", "Migrations"}},
		{[]string{"migrate", "down"}, slices.Concat(databaseVars, poolVars), []string{"Database", "Connections and waits"}},
		{[]string{"migrate", "force"}, slices.Concat(databaseVars, poolVars), []string{"Database", "Connections and waits"}},
		{[]string{"migrate", "version"}, databaseVars, []string{"Database"}},
		{[]string{"merchants", "create"}, databaseVars, []string{"Database"}},
		{[]string{"merchants", "list"}, databaseVars, []string{"Database"}},
		{[]string{"api-keys", "create"}, databaseVars, []string{"Database"}},
		{[]string{"api-keys", "list"}, databaseVars, []string{"Database"}},
		{[]string{"api-keys", "revoke"}, databaseVars, []string{"Database"}},
		{[]string{"charges", "resolve"}, databaseVars, []string{"Database"}},
		{[]string{"healthcheck"}, nil, nil},
		{[]string{"version"}, nil, nil},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout bytes.Buffer
			if err := run(context.Background(), append(tc.args, "-h"), envOf(nil), &stdout, io.Discard); err != nil {
				t.Fatal(err)
			}
			help := stdout.String()
			if got := submatches(`\(\$([A-Z_]+)\)`, help); !slices.Equal(got, tc.vars) {
				t.Errorf("-h lists\n%v\nwant\n%v\n%s", got, tc.vars, help)
			}
			if got := submatches(`(?m)^([A-Z][^\n]*):$`, help); !slices.Equal(got, tc.rooms) {
				t.Errorf("-h lists the rooms %q, want %q", got, tc.rooms)
			}
		})
	}
}

// submatches returns the first group of every match of expr in s.
func submatches(expr, s string) []string {
	var found []string
	for _, m := range regexp.MustCompile(expr).FindAllStringSubmatch(s, -1) {
		found = append(found, m[1])
	}
	return found
}

// TestRoomsHoldEverySettingOnce: each variable and flag is one setting, in one
// room, with a doc; each room is read by some command, and each command
// names rooms that exist.
func TestRoomsHoldEverySettingOnce(t *testing.T) {
	var c config
	var vars, flags []string
	var names []roomName
	for _, r := range c.rooms() {
		names = append(names, r.name)
		for _, s := range r.settings {
			if slices.Contains(vars, s.env) || slices.Contains(flags, s.flag) {
				t.Errorf("%s (--%s) is listed twice", s.env, s.flag)
			}
			if s.doc == "" || s.parse.set == nil || s.parse.typ == "" {
				t.Errorf("%s lacks a doc, a parser or a type", s.env)
			}
			vars, flags = append(vars, s.env), append(flags, s.flag)
		}
		if !slices.ContainsFunc(commands, func(cmd command) bool { return slices.Contains(cmd.rooms, r.name) }) {
			t.Errorf("no command reads the room %s", r.name)
		}
	}
	if want := append(slices.Clone(serveVars), "MIGRATE_WAIT"); !slices.Equal(slices.Sorted(slices.Values(vars)), slices.Sorted(slices.Values(want))) {
		t.Errorf("the rooms hold\n%v\nwant\n%v", vars, want)
	}
	for _, cmd := range commands {
		for _, r := range cmd.rooms {
			if !slices.Contains(names, r) {
				t.Errorf("%s reads the room %q, which does not exist", cmd.name, r)
			}
		}
		for _, env := range cmd.env {
			if !slices.Contains(vars, env) {
				t.Errorf("%s reads %s, which is no setting", cmd.name, env)
			}
		}
	}
}

// TestFlagOfAnotherCommand: a setting's flag that the command does not take
// but another does is an error naming those that do, with nothing printed;
// a flag no command takes stays the flag package's error, with a line on
// stderr saying where the command's settings are listed (not the whole
// usage, which scrolls the mistake away).
func TestFlagOfAnotherCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--webhook-delivery", "false"},
			`flag --webhook-delivery (WEBHOOK_DELIVERY) is a setting of payments serve, not of payments relay ("payments relay -h" lists its settings)`},
		{[]string{"relay", "--relay=false"}, "flag --relay (RELAY_ENABLED) is a setting of payments serve, not of payments relay"},
		{[]string{"consume", "-relay-batch", "5"}, "flag --relay-batch (RELAY_BATCH) is a setting of payments serve and relay, not of payments consume"},
		{[]string{"migrate", "up", "--nats-url", "nats://x"}, "flag --nats-url (NATS_URL) is a setting of payments serve, relay and consume, not of payments migrate up"},
		{[]string{"migrate", "version", "--commit-wait", "1s"},
			"flag --commit-wait (COMMIT_WAIT) is a setting of payments serve, relay, consume, migrate up, migrate down and migrate force, not of payments migrate version"},
		{[]string{"relay", "--migrate-wait", "1s"}, "flag --migrate-wait (MIGRATE_WAIT) is a setting of payments migrate up, not of payments relay"},
		{[]string{"merchants", "create", "--name", "Acme", "--log-level", "debug"}, "flag --log-level (LOG_LEVEL) is a setting of payments serve, relay and consume, not of payments merchants create"},
		{[]string{"api-keys", "revoke", "key_1", "--db-max-conns", "2"}, "not of payments api-keys revoke"},
		{[]string{"charges", "resolve", "ch_0123456789abcdef0123456789abcdef", "--processor-url", "http://x"},
			"flag --processor-url (PROCESSOR_URL) is a setting of payments serve and reconcile, not of payments charges resolve"},
		{[]string{"healthcheck", "--http-addr", ":9090"}, "flag --http-addr (HTTP_ADDR) is a setting of payments serve, not of payments healthcheck"},
		{[]string{"version", "--database-url", "postgres://x"}, "not of payments version"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tc.args, envOf(nil), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run = %v, want %q", err, tc.want)
			}
			if stdout.Len()+stderr.Len() != 0 {
				t.Errorf("stdout %q, stderr %q; want nothing: the error says it all", stdout.String(), stderr.String())
			}
		})
	}

	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"relay", "--no-such-flag"}, envOf(nil), &stdout, &stderr)
	if err == nil || err.Error() != "flag provided but not defined: -no-such-flag" {
		t.Errorf("relay --no-such-flag = %v, want the flag package's error", err)
	}
	if want := "flag provided but not defined: -no-such-flag\npayments relay -h lists its settings and their flags\n"; stdout.Len() != 0 || stderr.String() != want {
		t.Errorf("stdout %q, stderr %q; want %q on stderr", stdout.String(), stderr.String(), want)
	}
}

// TestUnreadVariablesAreIgnored: one environment serves several commands, so
// a command neither parses nor checks a variable it does not read, even one
// that would stop serve; what it does read is read as before.
func TestUnreadVariablesAreIgnored(t *testing.T) {
	env := map[string]string{
		"IDEMPOTENCY_TTL": "forever", "RELAY_ENABLED": "maybe", "WEBHOOK_DELIVERY": "nope", "CHARGE_BATCHES": "30",
		"JANITOR_INTERVAL": "1ms", "MIGRATE_WAIT": "soon", "HTTP_ADDR": "", "TRUSTED_PROXIES": "proxy.internal",
		"EVENT_RETENTION": "1h", "NATS_URL": "nats://broker:4222", "DB_MAX_CONNS": "4", "COMMIT_WAIT": "2s",
	}
	if _, err := loadConfig("serve", nil, envOf(env), io.Discard, io.Discard); err == nil {
		t.Fatal("serve accepted settings it must refuse")
	}
	cfg, err := loadConfig("consume", nil, envOf(env), io.Discard, io.Discard)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	if cfg.NATSURL != "nats://broker:4222" || cfg.Pool.MaxConns != 4 || cfg.Pool.CommitWait != 2*time.Second || cfg.Pool.KeyWait != 5*time.Second ||
		cfg.Keys.TTL != 0 || cfg.Relay.EventRetention != 0 || cfg.Parts.Relay {
		t.Errorf("consume read %+v; want its own settings only", cfg)
	}
	delete(env, "EVENT_RETENTION") // the relay's own, and too short
	for _, name := range []string{"relay", "migrate up", "migrate version", "merchants list", "api-keys revoke", "charges resolve"} {
		if name == "migrate up" {
			env["MIGRATE_WAIT"] = "5s"
		}
		if _, err := loadConfig(name, nil, envOf(env), io.Discard, io.Discard); err != nil {
			t.Errorf("%s: %v, want the variables it does not read ignored", name, err)
		}
	}
	env["EVENT_RETENTION"] = "1h"
	if _, err := loadConfig("relay", nil, envOf(env), io.Discard, io.Discard); err == nil || !strings.HasPrefix(err.Error(), "invalid EVENT_RETENTION") {
		t.Errorf("relay with EVENT_RETENTION=1h: %v, want it refused: the relay prunes events", err)
	}
}

// TestChecksApplyToReadSettings: a check on settings valid alone runs only
// when the command reads every setting it involves: in relay, the wait's
// bounds (its pool's) but not the TTL's floor.
func TestChecksApplyToReadSettings(t *testing.T) {
	c := config{Pool: poolConfig{MaxConns: 4, KeyWait: 5 * time.Second, CommitWait: 5 * time.Second},
		Keys:    keysConfig{TTL: 24 * time.Hour, JanitorInterval: time.Minute, JanitorBatch: 1000},
		Charges: chargesConfig{Batches: 4, AuthorizationTTL: time.Hour}, Relay: relayConfig{EventRetention: 720 * time.Hour},
		Processor: processorConfig{Timeout: 30 * time.Second, DecisionDeadline: 120 * time.Second}}
	same := func(env string) string { return env }
	all := func(string) bool { return true }
	but := func(skip string) func(string) bool { return func(env string) bool { return env != skip } }
	for _, tc := range []struct {
		name  string
		reads func(string) bool
		want  string
	}{
		{"every setting read", all, "invalid CHARGE_BATCHES: 4 leaves no connection of DB_MAX_CONNS (4)"},
		{"CHARGE_BATCHES not read", but("CHARGE_BATCHES"), ""},
		{"DB_MAX_CONNS not read", but("DB_MAX_CONNS"), ""},
	} {
		err := c.check(tc.reads, same)
		if got := errText(err); got != tc.want && (tc.want == "" || !strings.HasPrefix(got, tc.want)) {
			t.Errorf("%s: check = %q, want %q", tc.name, got, tc.want)
		}
	}

	env := envOf(map[string]string{"IDEMPOTENCY_TTL": "2s", "IDEMPOTENCY_WAIT": "900us"})
	if _, err := loadConfig("relay", nil, env, io.Discard, io.Discard); err == nil || !strings.HasPrefix(err.Error(), "invalid IDEMPOTENCY_WAIT: 900µs rounds to 0 ms") {
		t.Errorf("relay: %v, want IDEMPOTENCY_WAIT refused (it bounds the relay's lock waits)", err)
	}
	env = envOf(map[string]string{"IDEMPOTENCY_TTL": "2s"})
	if _, err := loadConfig("relay", nil, env, io.Discard, io.Discard); err != nil {
		t.Errorf("relay: %v, want IDEMPOTENCY_TTL, which it does not read, ignored", err)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
