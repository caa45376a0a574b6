#!/usr/bin/env bash
# ha.sh: a PostgreSQL HA cluster on this machine, for development and the
# failover tests (`make ha-up`, `make ha-down`, `make ha-status` call it).
#
# One etcd and two Patroni members, pg1 (PostgreSQL 127.0.0.1:5441, Patroni
# REST 127.0.0.1:8441) and pg2 (5442, 8442): a primary and a synchronous
# standby in strict mode. The configuration is deploy/ha/*.in, rendered into
# HA_DIR; data, logs, sockets and pid files live there too, outside the
# repository. Nothing uses systemd: the processes are started in sessions of
# their own (setsid), so they outlive the shell that ran `up`.
#
#   ha.sh up            start what is not running, wait for a settled
#                       cluster (a leader and a sync standby streaming to it,
#                       see healthy), create database payments, print the
#                       DATABASE_URL (the only line on stdout)
#   ha.sh down          stop everything, delete HA_DIR
#   ha.sh status        the processes and `patronictl list`
#   ha.sh wait          wait for a settled cluster again (after a fault)
#   ha.sh url           the DATABASE_URL
#   ha.sh primary       the leader's name and port: "pg1 5441"
#   ha.sh standby       the sync standby's name and port
#   ha.sh pid MEMBER    the postmaster pid of pg1 or pg2 (from its postmaster.pid)
#   ha.sh ctl ARGS...   patronictl with the cluster's configuration, e.g.
#                       `ha.sh ctl switchover --force`
#
# Environment: HA_DIR (default /var/tmp/payments-ha), HA_WAIT (seconds `up`
# and `wait` wait for a healthy cluster, default 90).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HA_DIR=${HA_DIR:-/var/tmp/payments-ha}
HA_WAIT=${HA_WAIT:-90}
PG_BIN=/usr/lib/postgresql/15/bin
MEMBERS=(pg1 pg2)
# As in deploy/ha/etcd.yml.in.
ETCD_PORT=23790
ETCD_PEER_PORT=23800
# Both members: libpq and pgx try them in order and keep the first that accepts
# writes, so a new connection finds the primary wherever it is now.
URL='postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/payments?sslmode=disable&target_session_attrs=read-write'
# The cluster_name Patroni gives PostgreSQL (its scope): every backend of the
# cluster shows it in its title, "postgres: payments-ha: ...".
SCOPE=payments-ha
MARKER=.payments-ha

say() { printf 'ha: %s\n' "$*" >&2; }
die() {
	printf 'ha: %s\n' "$@" >&2
	exit 1
}

pg_port() {
	case $1 in
	pg1) echo 5441 ;;
	pg2) echo 5442 ;;
	*) die "unknown member '$1' (pg1 or pg2)" ;;
	esac
}
api_port() {
	case $1 in
	pg1) echo 8441 ;;
	pg2) echo 8442 ;;
	*) die "unknown member '$1' (pg1 or pg2)" ;;
	esac
}

# AS_POSTGRES CMD...: run CMD as the postgres OS user. PostgreSQL refuses to
# run as root, and the data it writes must belong to the user that runs it.
# --reset-env: no PATRONI_* or PG* variable of the caller leaks in.
# (An array, not a function: setsid must exec it.)
AS_POSTGRES=()
if [ "$EUID" -eq 0 ]; then
	AS_POSTGRES=(setpriv --reuid=postgres --regid=postgres --init-groups --reset-env)
fi

# port_open PORT: whether something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# cmdline PID: the process's command line, arguments separated by spaces.
cmdline() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null; }

# alive NAME WORD: the pid in run/NAME.pid, when that process runs and its
# command line contains WORD (a recycled pid does not count).
alive() {
	local pid
	pid=$(cat "$HA_DIR/run/$1.pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [[ "$(cmdline "$pid")" == *"$2"* ]] || return 1
	echo "$pid"
}

# postmaster MEMBER: the member's postmaster pid, when it runs.
postmaster() {
	local pid
	pid=$(head -n 1 "$HA_DIR/$1/postmaster.pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [[ "$(cmdline "$pid")" == *"$HA_DIR/$1"* ]] || return 1
	echo "$pid"
}

# our_pids: every process of this cluster, found by what it runs and where:
# Patroni, etcd, pg_rewind or pg_basebackup naming HA_DIR, and PostgreSQL
# processes naming HA_DIR or titled with the cluster's name (a backend whose
# postmaster was killed is orphaned, and found only by its title).
our_pids() {
	local p pid comm cmd
	for p in /proc/[0-9]*; do
		pid=${p#/proc/}
		read -r comm <"$p/comm" 2>/dev/null || continue
		case $comm in
		postgres | patroni | etcd | pg_*) ;;
		*) continue ;;
		esac
		cmd=$(cmdline "$pid") || continue
		if [[ "$cmd" == *"$HA_DIR/"* || "$cmd" == "postgres: $SCOPE: "* ]]; then
			echo "$pid"
		fi
	done
}

# members: one line per member from Patroni's REST API (/cluster, asked of
# whichever member answers): name, role (leader, sync_standby, replica),
# state (running, stopped, starting, ...), PostgreSQL port and timeline.
# Fails when no member answers.
members() {
	/usr/bin/python3 - "$(api_port pg1)" "$(api_port pg2)" <<'PY'
import json, sys, urllib.request
for port in sys.argv[1:]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster", timeout=2) as r:
            cluster = json.load(r)
    except Exception:
        continue
    for m in cluster.get("members", []):
        print(m["name"], m["role"], m.get("state", ""), m.get("port", ""), m.get("timeline", ""), sep="\t")
    sys.exit(0)
sys.exit(1)
PY
}

# healthy: whether the cluster is settled, as the failover scenarios require
# before each fault (internal/chaos/cluster_test.go, settle): Patroni names a
# running leader and a sync standby, the leader's PostgreSQL accepts writes
# and names that standby in synchronous_standby_names, the standby streams to
# it as synchronous, and the standby's PostgreSQL is in recovery. Patroni's
# word alone lags a fault by up to a loop: right after a kill it still shows
# the dead member as running.
# (Patroni 3.0 says "running" for a standby that streams; later versions say
# "streaming".)
healthy() {
	local line
	line=$(members 2>/dev/null | awk -F '\t' '
		$2 == "leader" && $3 == "running" { port = $4 }
		$2 == "sync_standby" && ($3 == "running" || $3 == "streaming") { sync = $1; sync_port = $4 }
		END { if (port && sync) print port, sync, sync_port; else exit 1 }') || return 1
	local port sync sync_port
	read -r port sync sync_port <<<"$line"
	local psql=("$PG_BIN/psql" -X -At -h 127.0.0.1 -U postgres -d postgres)
	[ "$(PGCONNECT_TIMEOUT=2 "${psql[@]}" -p "$port" -c "
		SELECT NOT pg_is_in_recovery()
		   AND '$sync' = ANY (regexp_split_to_array(current_setting('synchronous_standby_names'), '[\s,()\"]+'))
		   AND EXISTS (SELECT 1 FROM pg_stat_replication
		               WHERE application_name = '$sync' AND state = 'streaming' AND sync_state = 'sync')" \
		2>/dev/null)" = t ] &&
		[ "$(PGCONNECT_TIMEOUT=2 "${psql[@]}" -p "$sync_port" -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = t ]
}

# wait_healthy: wait up to HA_WAIT seconds for healthy; on timeout, show
# the state and the end of every log, and fail.
wait_healthy() {
	local deadline=$((SECONDS + HA_WAIT)) next=$((SECONDS + 10))
	until healthy; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			say "no leader with a sync standby after ${HA_WAIT} s (HA_WAIT); the members:"
			members >&2 || say "no Patroni REST API answers"
			local log
			for log in "$HA_DIR"/log/*.log "$HA_DIR"/log/*/postgresql.log; do
				[ -f "$log" ] || continue
				say "--- last lines of $log"
				tail -n 15 "$log" >&2
			done
			return 1
		fi
		if [ "$SECONDS" -ge "$next" ]; then
			say "waiting for a leader and a sync standby ($((deadline - SECONDS)) s left)"
			next=$((SECONDS + 10))
		fi
		sleep 0.5
	done
}

# role_line ROLE: "name port" of the member with that role.
role_line() {
	local line
	line=$(members | awk -F '\t' -v role="$1" '$2 == role && !found { print $1, $4; found = 1 }') || die "no Patroni REST API answers on 127.0.0.1:$(api_port pg1) or :$(api_port pg2)"
	[ -n "$line" ] || die "no member is $1 now"
	echo "$line"
}

# start_bg NAME LOG CMD...: start CMD as postgres in a session of its own
# (no controlling terminal, so no SIGHUP when the starting shell exits), its
# output appended to LOG, and record its pid in run/NAME.pid. A background
# job of a non-interactive shell is not a process group leader, so setsid
# execs CMD in place and $! is CMD's pid.
start_bg() {
	local name=$1 log=$2
	shift 2
	setsid "$@" </dev/null >>"$log" 2>&1 &
	echo $! >"$HA_DIR/run/$name.pid"
}

# require_free PORT WHAT: fail, naming it, when PORT is taken by something
# that is not this cluster.
require_free() {
	if port_open "$1"; then
		die "127.0.0.1:$1 ($2) is taken by a process that is not this cluster's; stop it first"
	fi
}

# prepare: create HA_DIR (owned by postgres, marked as ours so that `down`
# deletes only what `up` made) and render the configuration into it.
prepare() {
	case $HA_DIR in
	/?*) ;;
	*) die "HA_DIR must be an absolute path, not '$HA_DIR'" ;;
	esac
	if [ -d "$HA_DIR" ] && [ ! -e "$HA_DIR/$MARKER" ]; then
		die "$HA_DIR exists and was not made by ha.sh (no $MARKER in it); choose another HA_DIR"
	fi
	mkdir -p "$HA_DIR/run" "$HA_DIR/log"
	touch "$HA_DIR/$MARKER"
	sed -e "s|@HA_DIR@|$HA_DIR|g" "$repo/deploy/ha/etcd.yml.in" >"$HA_DIR/etcd.yml"
	local m
	for m in "${MEMBERS[@]}"; do
		sed -e "s|@HA_DIR@|$HA_DIR|g" -e "s|@NAME@|$m|g" \
			-e "s|@PG_PORT@|$(pg_port "$m")|g" -e "s|@API_PORT@|$(api_port "$m")|g" \
			"$repo/deploy/ha/patroni.yml.in" >"$HA_DIR/$m.yml"
	done
	if [ "$EUID" -eq 0 ]; then
		chown -R postgres:postgres "$HA_DIR"
	fi
}

start_etcd() {
	if alive etcd "$HA_DIR/etcd.yml" >/dev/null; then
		return
	fi
	require_free "$ETCD_PORT" "etcd client"
	require_free "$ETCD_PEER_PORT" "etcd peer"
	say "starting etcd on 127.0.0.1:$ETCD_PORT (log: $HA_DIR/log/etcd.log)"
	start_bg etcd "$HA_DIR/log/etcd.log" "${AS_POSTGRES[@]}" etcd --config-file "$HA_DIR/etcd.yml"
	local _
	for _ in $(seq 1 60); do
		port_open "$ETCD_PORT" && return 0
		alive etcd "$HA_DIR/etcd.yml" >/dev/null || break
		sleep 0.25
	done
	tail -n 20 "$HA_DIR/log/etcd.log" >&2
	die "etcd did not start (log above: $HA_DIR/log/etcd.log)"
}

# start_member MEMBER: start its Patroni, which starts (or first initialises
# or clones) its PostgreSQL. A postmaster left running by a Patroni that was
# killed is adopted by the new Patroni, so its port is not a clash.
start_member() {
	local m=$1
	if alive "$m" "$HA_DIR/$m.yml" >/dev/null; then
		return
	fi
	if ! postmaster "$m" >/dev/null; then
		require_free "$(pg_port "$m")" "PostgreSQL of $m"
	fi
	require_free "$(api_port "$m")" "Patroni REST API of $m"
	say "starting $m: PostgreSQL 127.0.0.1:$(pg_port "$m"), Patroni 127.0.0.1:$(api_port "$m") (log: $HA_DIR/log/$m-patroni.log)"
	start_bg "$m" "$HA_DIR/log/$m-patroni.log" "${AS_POSTGRES[@]}" patroni "$HA_DIR/$m.yml"
}

# ensure_database: the service's database, created on the leader (it
# replicates) when missing; `payments migrate up` would create it too, but
# psql to the URL should work straight after `up`.
ensure_database() {
	local port
	port=$(role_line leader | cut -d ' ' -f 2)
	local psql=("$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1)
	if [ "$("${psql[@]}" -Atc "SELECT count(*) FROM pg_database WHERE datname = 'payments'")" = 0 ]; then
		say "creating database payments"
		"${psql[@]}" -c 'CREATE DATABASE payments'
	fi
}

cmd_up() {
	local missing=() c
	for c in patroni patronictl etcd setsid setpriv; do
		command -v "$c" >/dev/null 2>&1 || missing+=("$c")
	done
	[ -x "$PG_BIN/postgres" ] || missing+=("$PG_BIN/postgres")
	[ "${#missing[@]}" -eq 0 ] || die "missing: ${missing[*]}" \
		"install them: apt-get install -y patroni etcd-server etcd-client postgresql-15"
	if [ "$EUID" -eq 0 ]; then
		id postgres >/dev/null 2>&1 || die "no postgres OS user to run PostgreSQL as (the postgresql-15 package creates it)"
	fi

	local started=$SECONDS
	prepare
	start_etcd
	local m
	for m in "${MEMBERS[@]}"; do
		start_member "$m"
	done
	wait_healthy
	ensure_database
	say "up in $((SECONDS - started)) s: leader $(role_line leader), sync standby $(role_line sync_standby)"
	say "logs in $HA_DIR/log; stop with: make ha-down"
	echo "$URL"
}

# stop_pids SECONDS PID...: SIGTERM to each, then SIGKILL to those still
# there after SECONDS.
stop_pids() {
	local secs=$1 deadline=$((SECONDS + $1)) pid
	shift
	kill -TERM "$@" 2>/dev/null || true
	for pid in "$@"; do
		while kill -0 "$pid" 2>/dev/null; do
			if [ "$SECONDS" -ge "$deadline" ]; then
				say "pid $pid ($(cmdline "$pid")) ignored SIGTERM for $secs s: SIGKILL"
				kill -KILL "$pid" 2>/dev/null || true
				break
			fi
			sleep 0.2
		done
	done
}

cmd_down() {
	local m pid pids=()
	# Patroni stops its PostgreSQL on SIGTERM (a primary with a live standby
	# first hands the leader key over, a sync standby first waits up to two
	# loops to be released); both at once, since all is deleted anyway. They
	# need etcd meanwhile, so etcd stops last.
	for m in "${MEMBERS[@]}"; do
		if pid=$(alive "$m" "$HA_DIR/$m.yml"); then
			say "stopping $m (Patroni pid $pid)"
			pids+=("$pid")
		fi
	done
	[ "${#pids[@]}" -eq 0 ] || stop_pids 60 "${pids[@]}"
	# A postmaster whose Patroni was killed (a chaos test may do that) is
	# still there: SIGQUIT is PostgreSQL's immediate shutdown.
	for m in "${MEMBERS[@]}"; do
		if pid=$(postmaster "$m"); then
			say "stopping $m's orphaned postmaster (pid $pid)"
			kill -QUIT "$pid" 2>/dev/null || true
		fi
	done
	if pid=$(alive etcd "$HA_DIR/etcd.yml"); then
		say "stopping etcd (pid $pid)"
		stop_pids 30 "$pid"
	fi
	# What is left: backends of a killed postmaster that have not yet noticed
	# its death, a pg_rewind, a postmaster shutting down. Give them 10 s.
	local left deadline=$((SECONDS + 10))
	while left=$(our_pids) && [ -n "$left" ]; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			for pid in $left; do
				say "pid $pid ($(cmdline "$pid")) still runs: SIGKILL"
				kill -KILL "$pid" 2>/dev/null || true
			done
			sleep 0.5
			left=$(our_pids)
			[ -z "$left" ] || die "these processes of the cluster survived SIGKILL: $left"
			break
		fi
		sleep 0.2
	done
	if [ -e "$HA_DIR/$MARKER" ]; then
		rm -rf -- "$HA_DIR"
		say "down; removed $HA_DIR"
	elif [ -d "$HA_DIR" ]; then
		die "$HA_DIR was not made by ha.sh (no $MARKER in it); not removing it"
	else
		say "down; nothing in $HA_DIR"
	fi
}

cmd_status() {
	local m pid any=
	if pid=$(alive etcd "$HA_DIR/etcd.yml"); then
		say "etcd: pid $pid, 127.0.0.1:$ETCD_PORT"
		any=1
	else
		say "etcd: not running"
	fi
	for m in "${MEMBERS[@]}"; do
		if pid=$(alive "$m" "$HA_DIR/$m.yml"); then
			say "$m: Patroni pid $pid, postmaster pid $(postmaster "$m" || echo none), PostgreSQL 127.0.0.1:$(pg_port "$m")"
			any=1
		else
			say "$m: Patroni not running"
		fi
	done
	if [ -n "$any" ]; then
		# patronictl retries for as long as etcd does not answer: bounded.
		timeout 20 patronictl -c "$HA_DIR/pg1.yml" list || say "patronictl list failed (etcd down?)"
		echo "DATABASE_URL=$URL"
	fi
}

cmd=${1:-}
[ "$#" -eq 0 ] || shift
case $cmd in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
wait) wait_healthy ;;
url) echo "$URL" ;;
primary) role_line leader ;;
standby) role_line sync_standby ;;
pid)
	[ "$#" -eq 1 ] || die "usage: ha.sh pid pg1|pg2"
	pg_port "$1" >/dev/null
	postmaster "$1" || die "$1's postmaster is not running"
	;;
ctl)
	[ -f "$HA_DIR/pg1.yml" ] || die "no cluster in $HA_DIR; start it with: make ha-up"
	exec patronictl -c "$HA_DIR/pg1.yml" "$@"
	;;
*)
	die "usage: ha.sh up|down|status|wait|url|primary|standby|pid MEMBER|ctl ARGS..." \
		"(read the top of scripts/ha.sh)"
	;;
esac
