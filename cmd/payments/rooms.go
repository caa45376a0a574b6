package main

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exactlyonce/payments/internal/webhook"
)

// roomName names a room: the settings of one part of the service. A command
// reads the rooms it names in commands, and only those.
type roomName string

const (
	roomDatabase   roomName = "database"
	roomPool       roomName = "pool"
	roomHTTP       roomName = "http"
	roomShutdown   roomName = "shutdown"
	roomKeys       roomName = "keys"
	roomCharges    roomName = "charges"
	roomProcessor  roomName = "processor"
	roomParts      roomName = "parts"
	roomNATS       roomName = "nats"
	roomRelay      roomName = "relay"
	roomWebhooks   roomName = "webhooks"
	roomMetrics    roomName = "metrics"
	roomMonitor    roomName = "monitor"
	roomLogging    roomName = "logging"
	roomMigrations roomName = "migrations"
)

// command is what one command reads: its rooms, and env, variables it reads
// without taking their flags. operands come between its name and [flags] in
// its usage line.
type command struct {
	name, operands string
	rooms          []roomName
	env            []string
}

// usage is the command's usage line.
func (c command) usage() string {
	return strings.Join(strings.Fields("usage: payments "+c.name+" "+c.operands+" [flags]"), " ")
}

// commands are the commands and what each reads: its code uses those settings
// and no other (a setting it does not read is its zero value).
var commands = []command{
	{name: "serve", rooms: []roomName{roomDatabase, roomPool, roomHTTP, roomShutdown, roomKeys, roomCharges, roomProcessor, roomParts,
		roomNATS, roomRelay, roomWebhooks, roomMetrics, roomMonitor, roomLogging}},
	{name: "relay", rooms: []roomName{roomDatabase, roomPool, roomNATS, roomRelay, roomMetrics, roomLogging}},
	{name: "consume", rooms: []roomName{roomDatabase, roomPool, roomNATS, roomMetrics, roomLogging}},
	// up, down and force wait, on a pool, for the synchronous standby to
	// confirm the schema (confirmCommitted); version only reads it.
	{name: "migrate up", rooms: []roomName{roomDatabase, roomPool, roomMigrations}},
	{name: "migrate down", rooms: []roomName{roomDatabase, roomPool}},
	{name: "migrate force", operands: "VERSION", rooms: []roomName{roomDatabase, roomPool}},
	{name: "migrate version", rooms: []roomName{roomDatabase}},
	// The operator commands open one connection with fixed bounds (openAdmin).
	{name: "merchants create", operands: "--name NAME", rooms: []roomName{roomDatabase}},
	{name: "merchants list", operands: "[--limit N] [--starting-after MERCHANT_ID]", rooms: []roomName{roomDatabase}},
	{name: "api-keys create", operands: "--merchant ID", rooms: []roomName{roomDatabase}},
	{name: "api-keys list", operands: "--merchant ID", rooms: []roomName{roomDatabase}},
	{name: "api-keys revoke", operands: "KEY_ID", rooms: []roomName{roomDatabase}},
	{name: "charges resolve", operands: "CHARGE_ID --as succeeded|failed --reason TEXT --operator NAME", rooms: []roomName{roomDatabase}},
	// The processor's room says which processor, and bounds its calls.
	{name: "reconcile", operands: "--since T", rooms: []roomName{roomDatabase, roomProcessor}},
	{name: "healthcheck", env: []string{"HTTP_ADDR"}},
	{name: "version"},
}

// commandNamed returns the command called name; it panics on a name that
// commands lacks, a mistake of this package.
func commandNamed(name string) command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	panic("cmd/payments: no command " + name + " in commands")
}

// setting returns the setting of c's rooms whose flag is flagName.
func (c command) setting(flagName string) (setting, bool) {
	var cfg config
	for _, r := range cfg.rooms() {
		if !slices.Contains(c.rooms, r.name) {
			continue
		}
		if i := slices.IndexFunc(r.settings, func(s setting) bool { return s.flag == flagName }); i >= 0 {
			return r.settings[i], true
		}
	}
	return setting{}, false
}

// room is one part's settings, in the order -h and docs/operations.md list
// them.
type room struct {
	name         roomName
	title, about string
	settings     []setting
}

// setting is one configuration value: its variable, flag, default, what it
// means and its parser. doc is written for docs/operations.md (`code` and
// [links](#anchor)); -h shows it plain (plainDoc).
type setting struct {
	env, flag, def, doc string
	parse               parser
}

// rooms returns every room in the order -h and docs/operations.md list
// them, its settings parsing into c.
func (c *config) rooms() []room {
	rooms := []room{c.databaseRoom(), c.poolRoom()}
	rooms = append(rooms, c.apiRooms()...)
	rooms = append(rooms, c.keysRoom(), c.chargesRoom(), c.processorRoom())
	rooms = append(rooms, c.eventRooms()...)
	return append(rooms, c.operatorRooms()...)
}

func (c *config) databaseRoom() room {
	return room{roomDatabase, "Database", "Where PostgreSQL is.", []setting{
		{"DATABASE_URL", "database-url", "postgres://postgres@localhost:5432/payments?sslmode=disable",
			"PostgreSQL connection URL", parser{"url", func(v string) error {
				c.DatabaseURL = v
				if scheme, _, ok := strings.Cut(v, "://"); ok && scheme != "postgres" && scheme != "postgresql" {
					return fmt.Errorf("want a postgres:// (or postgresql://) URL or key=value settings, got a %s:// URL", scheme)
				}
				return nonEmpty(v)
			}}},
	}}
}

// apiRooms: serve's listener and its way out of traffic.
func (c *config) apiRooms() []room {
	return []room{
		{roomHTTP, "HTTP API", "Where serve answers, and whom it believes about its clients.", []setting{
			{"HTTP_ADDR", "http-addr", ":8080", "address the API listens on; `healthcheck` asks `/readyz` there",
				parser{"address", func(v string) error { c.HTTP.Addr = v; return nonEmpty(v) }}},
			{"TRUSTED_PROXIES", "trusted-proxies", "", "comma-separated addresses or CIDRs of the proxies in front of the service (`10.0.0.0/8,192.0.2.7`): " +
				"their `X-Forwarded-For` names the client for the budget of unknown API keys (see [API keys](#api-keys-rotation-and-revocation)); " +
				"from any other peer the header is ignored",
				parser{"cidrs", func(v string) (err error) { c.HTTP.TrustedProxies, err = parsePrefixes(v); return err }}},
			{"RATE_LIMIT_READS", "rate-limit-reads", "100", "reads (`GET`) each merchant may make a second on this replica, " +
				"with a burst of one second's worth; past it, `429 rate-limited` with `Retry-After`, before anything is read " +
				"(see [Rate limits](#rate-limits-between-merchants)); `0`: no limit",
				rateInto(&c.HTTP.Budget.Reads)},
			{"RATE_LIMIT_WRITES", "rate-limit-writes", "1000", "writes (`POST`, `DELETE`) each merchant may make a second on this replica, " +
				"with a burst of one second's worth; past it, `429 rate-limited` with `Retry-After`, before any idempotency key is claimed; `0`: no limit",
				rateInto(&c.HTTP.Budget.Writes)},
			{"ACCESS_LOG", "access-log", "info", "the level of the access line (one a request, see [Logs](#logs)): `info`, `debug` " +
				"(out of an INFO log, as `LOG_LEVEL` says) or `off`",
				parser{"level", func(v string) error {
					switch v {
					case "off":
						c.HTTP.AccessLog.Off = true
					case "info":
						c.HTTP.AccessLog.Level = slog.LevelInfo
					case "debug":
						c.HTTP.AccessLog.Level = slog.LevelDebug
					default:
						return fmt.Errorf("want info, debug or off, got %q", v)
					}
					return nil
				}}},
			{"ACCESS_LOG_SAMPLE", "access-log-sample", "1", "the share of successful requests (below `400`) that get an access line, " +
				"from `0.001` to `1`; every failed request gets one",
				parser{"fraction", func(v string) error {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil || f < 0.001 || f > 1 {
						return fmt.Errorf("want a share from 0.001 to 1, got %q", v)
					}
					c.HTTP.AccessLog.Sample = f
					return nil
				}}},
		}},
		{roomShutdown, "Shutdown", "How serve leaves traffic on SIGTERM.", []setting{
			{"SHUTDOWN_DELAY", "shutdown-delay", "5s", "after SIGTERM, how long every request is still served while `/readyz` answers `503 shutting-down`, " +
				"so that load balancers stop sending before the listener closes " +
				"(see [Shutdown](#shutdown-draining-behind-a-load-balancer-or-kubernetes)); `0` closes it at once",
				durationOrZero(&c.Shutdown.Delay)},
			{"SHUTDOWN_TIMEOUT", "shutdown-timeout", "15s", "how long in-flight requests may finish once the listener has closed (after `SHUTDOWN_DELAY`)",
				durationInto(&c.Shutdown.Timeout)},
		}},
	}
}

// operatorRooms: what an operator watches, and migrations.
func (c *config) operatorRooms() []room {
	return []room{
		{roomMetrics, "Metrics", "The listener every long-running command has for Prometheus.", []setting{
			{"METRICS_ADDR", "metrics-addr", "127.0.0.1:9464", "address of the listener serving Prometheus metrics at `/metrics` " +
				"(and liveness at `/healthz`), apart from the API, in `serve`, `relay` and `consume` alike: give each process on one host its own port " +
				"(`off`: none; an empty variable means the default, as for every setting). Loopback by default; in a container or a pod set `:9464` " +
				"(see [Scraping](#scraping-and-the-dashboard))",
				parser{"address", func(v string) error {
					if v == "off" {
						v = ""
					}
					c.MetricsAddr = v
					return nil
				}}},
		}},
		c.monitorRoom(),
		{roomLogging, "Logging", "", []setting{
			{"LOG_LEVEL", "log-level", "info", "`debug`, `info`, `warn` or `error`",
				parser{"level", func(v string) error {
					if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
						return fmt.Errorf("want debug, info, warn or error, got %q", v)
					}
					return nil
				}}},
		}},
		{roomMigrations, "Migrations", "", []setting{
			{"MIGRATE_WAIT", "migrate-wait", "60s", "how long `migrate up` waits for PostgreSQL to accept connections " +
				"(refused, not resolvable yet, starting up), printing a line per wait; other errors fail at once",
				durationInto(&c.MigrateWait)},
		}},
	}
}

// poolRoom: the pool of every command that keeps one, and the bounds on what
// its statements wait for. IDEMPOTENCY_WAIT is here because it bounds waits
// in every such command, not only keys' (storeOptions, openCharging).
func (c *config) poolRoom() room {
	return room{roomPool, "Connections and waits", "The connection pool of each command that has one, and how long its work waits for a connection, a lock or the standby.", []setting{
		{"DB_MAX_CONNS", "db-max-conns", "20", "most PostgreSQL connections in the pool (a value above `10000` counts as `10000`); " +
			"reads (`GET`) hold at most half of them at once, so they never take the connections writes need",
			parser{"int", func(v string) error {
				var n int
				if err := positiveInt(&n).set(v); err != nil {
					return err
				}
				c.Pool.MaxConns = int32(min(n, 10_000))
				return nil
			}}},
		{"IDEMPOTENCY_WAIT", "idempotency-wait", "5s", "how long a retry waits behind an in-flight request with its key, on any replica, " +
			"before `409 idempotency-key-in-use`. It bounds other waits too, each failing `503` past it: in every command with a pool, " +
			"the wait for a pooled connection and every lock wait (PostgreSQL's `lock_timeout`); in `serve`, an API key's lookup, " +
			"a charge's wait for a batch, and a charge's wait, after its batch, for a key in flight or an account locked elsewhere. " +
			"A charge batch running longer than `IDEMPOTENCY_WAIT` + `COMMIT_WAIT` is stuck (`/readyz` answers `503`). " +
			"Refused below " + code(minKeyWait) + " (`lock_timeout` is whole milliseconds, `0` none) or above " + code(maxKeyWait),
			durationInto(&c.Pool.KeyWait)},
		{"COMMIT_WAIT", "commit-wait", "5s", "how long a commit may wait for a synchronous standby's confirmation; past it, or on any warning, " +
			"the request answers `503` instead of success, and a read waits as long for the standby to have what it would show " +
			"(see [High availability](#high-availability)); refused below " + code(minCommitWait) + " or above " + code(maxKeyWait),
			durationInto(&c.Pool.CommitWait)},
	}}
}

func (c *config) keysRoom() room {
	return room{roomKeys, "Idempotency keys", "How long keys live, the replay cache, and the janitor that deletes expired keys. " +
		"The wait behind a key in flight is `IDEMPOTENCY_WAIT`, under connections and waits.", []setting{
		{"IDEMPOTENCY_TTL", "idempotency-ttl", "24h", "how long keys and their responses are kept, counted from when the response is stored; " +
			"refused below " + code(minKeyTTL),
			durationInto(&c.Keys.TTL)},
		{"IDEMPOTENCY_CACHE_SIZE", "idempotency-cache-size", "10000", "most completed responses kept in memory so hot replays skip the database (`0` disables)",
			wholeNumber(&c.Keys.CacheSize)},
		{"IDEMPOTENCY_CACHE_BYTES", "idempotency-cache-bytes", "64MiB", "most memory those responses take (bytes, or `KiB`/`MiB`/`GiB`), " +
			"counting key, body and overhead; a response over 1/256 of it is not cached (`0` disables)",
			sizeInto(&c.Keys.CacheBytes)},
		{"JANITOR_INTERVAL", "janitor-interval", "1m", "how often keys past `IDEMPOTENCY_TTL` are deleted (one janitor across replicas); " +
			"after a failed sweep it tries again within an interval, then up to four intervals apart (with jitter) until one succeeds; " +
			"refused below " + code(minJanitorInterval) + " or above `IDEMPOTENCY_TTL`",
			durationInto(&c.Keys.JanitorInterval)},
		{"JANITOR_BATCH", "janitor-batch", "1000", fmt.Sprintf("most expired keys deleted per transaction; refused above `%d`", maxJanitorBatch),
			positiveInt(&c.Keys.JanitorBatch)},
	}}
}

func (c *config) chargesRoom() room {
	return room{roomCharges, "Charges", "Group commit and authorizations.", []setting{
		{"CHARGE_BATCH_SIZE", "charge-batch-size", "64", "most concurrent charges committed together in one transaction (group commit)",
			positiveInt(&c.Charges.BatchSize)},
		{"CHARGE_BATCHES", "charge-batches", "1", "charge batches in flight at once; a charge waits for company only while all are busy; " +
			"refused unless below `DB_MAX_CONNS` (each batch holds a connection)",
			positiveInt(&c.Charges.Batches)},
		{"CHARGE_AUTHORIZATION_TTL", "charge-authorization-ttl", "168h", "how long an authorization (`\"capture\": false`) holds its amount: " +
			"its `expires_at` is its creation plus this; refused below " + code(minAuthorizationTTL) + " or above " + code(maxAuthorizationTTL) + " (31 days), " +
			"and unless above `IDEMPOTENCY_WAIT` plus `COMMIT_WAIT` plus 1s (the longest an answer may follow its transaction's start: never answered expired)",
			durationInto(&c.Charges.AuthorizationTTL)},
		{"CHARGE_EXPIRY_INTERVAL", "charge-expiry-interval", "30s", "how often the authorizations past their `expires_at` are written as `expired`, " +
			"with their `charge.expired` events, in batches (one sweeper across replicas); reads show them expired at once, sweep or not; at least `1s`",
			durationAtLeast(&c.Charges.ExpiryInterval, time.Second)},
	}}
}

// eventRooms: what serve runs beside the API, NATS, the relay and webhooks.
func (c *config) eventRooms() []room {
	return []room{
		{roomParts, "Serve's parts", "What serve runs beside the API; `payments relay` runs the relay alone.", []setting{
			{"RELAY_ENABLED", "relay-enabled", "true", "whether `serve` also runs the outbox relay (one process leads at a time)",
				boolInto(&c.Parts.Relay)},
			{"WEBHOOK_DELIVERY", "webhook-delivery", "true", "whether `serve` delivers webhooks; the replicas that do share the work " +
				"(one fans events out at a time, deliveries are leased), so it may be off on some",
				boolInto(&c.Parts.WebhookDelivery)},
			{"PPROF_ADDR", "pprof-addr", "", "address of a listener serving Go's profiler (`/debug/pprof/`), for performance work; " +
				"empty: none. Keep it on loopback",
				parser{"address", func(v string) error { c.Parts.PprofAddr = v; return nil }}},
		}},
		{roomNATS, "NATS", "The broker events go through.", []setting{
			{"NATS_URL", "nats-url", "nats://127.0.0.1:4222", "NATS server with JetStream: the relay publishes events there, the consumer reads them",
				parser{"url", func(v string) error { c.NATSURL = v; return nonEmpty(v) }}},
		}},
		{roomRelay, "Outbox relay", "The relay, in serve or alone, and how long published events stay.", []setting{
			{"RELAY_BATCH", "relay-batch", "100", "most events the relay publishes per round",
				positiveInt(&c.Relay.Batch)},
			{"RELAY_POLL", "relay-poll", "1s", "how often the relay looks without a notification (and a standby relay tries to take over)",
				durationInto(&c.Relay.Poll)},
			{"EVENT_RETENTION", "event-retention", "720h", "how long published events stay in the outbox and the `/v1/events` feed, " +
				"and webhook attempts and settled deliveries in their record (`GET .../attempts`); refused at " + code(webhook.DefaultRetryFor) +
				" or less (webhook deliveries are retried that long)",
				durationInto(&c.Relay.EventRetention)},
		}},
		{roomWebhooks, "Webhooks", "", []setting{
			{"WEBHOOK_ALLOW_PRIVATE_NETWORKS", "webhook-allow-private-networks", "false", "`true` lets webhook endpoints be `http` URLs " +
				"and loopback, private or link-local addresses, which are otherwise refused with `400` (see [Webhooks](webhooks.md)); " +
				"for development and tests only, since it lets an API caller make the service send requests inside its network; logged at `WARN` at start when on",
				boolInto(&c.WebhookAllowPrivate)},
		}},
	}
}

func (c *config) monitorRoom() room {
	return room{roomMonitor, "Outbox monitoring", "Serve samples the outbox for its gauges, so that a scrape does no database work.", []setting{
		{"METRICS_SAMPLE", "metrics-sample", "15s", "how often the outbox is sampled for the gauges that need the database " +
			"(the backlog, `payments_events_held_seconds`, the due webhook deliveries, the newest run of `payments reconcile`) and for the `EVENTS_HELD_WARN` warning, in the background on a connection of its own; " +
			"after a failed sample, " +
			"within an interval, then up to four intervals apart (with jitter) until one succeeds; at least `1s`",
			durationAtLeast(&c.Monitor.Sample, time.Second)},
		{"EVENTS_HELD_WARN", "events-held-warn", "30s", "log a warning naming the transaction of this database (pid, xid, age) " +
			"that holds events back, once an event has waited this long",
			durationInto(&c.Monitor.HeldWarn)},
	}}
}

// code is d as docs/operations.md shows a bound: `1h`, `20s`, `100ms`, not
// time.Duration's 1h0m0s.
func code(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return "`" + s + "`"
}
