#!/usr/bin/env bash
# bench-pair.sh: fresh charges of two builds of the service, paired in one run
# (make bench-pair; issue 24's measurements of one change at a time).
#
#   PAIR_A=<git rev> PAIR_B=<git rev> scripts/bench-pair.sh
#
# Each build (default: A the commit before HEAD, B the working tree) is built
# into bin/pair-{A,B}. In every round, A then B and then B then A (so neither
# side always goes first), each with the relay on (publishing to the local
# NATS, as shipped) and off: a new database migrated by that build, a merchant,
# `payments serve`, a CHECKPOINT, then paymentsbench's fresh scenario (16
# clients over 1,000 accounts, 10 s) with -cpu. pg-reference runs once a round
# beside them. Prints one line per measurement and then the medians: charges/s,
# × pg-reference, p50, with PAIR_EVENTS=1 and the relay on the p99 of the
# charges' events from their transaction's start to a NATS subscriber
# (paymentsbench -events-url; the subscriber adds to nats-server's and the load
# generator's CPU, so measure CPU without it), and CPU per charge (ms) of the
# machine, the service, PostgreSQL, nats-server and the load generator.
#
# PAIR_A_ENV and PAIR_B_ENV add settings to one side's service (for example
# PAIR_B_ENV="CHARGE_BATCHES=2" with PAIR_A=HEAD PAIR_B=HEAD compares a setting).
# PAIR_ROUNDS (3), PAIR_SECONDS (10), PAIR_CLIENTS (16), PAIR_ACCOUNTS (1000),
# PAIR_RELAY ("on off"), PAIR_EVENTS (unset), PAIR_OUT (a temporary directory: every JSON line and
# log) tune it. Needs PostgreSQL (PAYMENTS_TEST_DATABASE_URL or the local
# server) and, with the relay on, NATS at NATS_URL (nats://127.0.0.1:4222).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'bench-pair: %s\n' "$*" >&2; }
die() { say "$@"; exit 1; }
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh # start_service, stop_service, new_merchant, median

admin=${PAYMENTS_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
rounds=${PAIR_ROUNDS:-3} seconds=${PAIR_SECONDS:-10} clients=${PAIR_CLIENTS:-16}
accounts=${PAIR_ACCOUNTS:-1000} relays=${PAIR_RELAY:-on off}
out=${PAIR_OUT:-$(mktemp -d /tmp/bench-pair.XXXXXX)}
mkdir -p "$out" bin
export NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
shared=$(cd .. && pwd)/shared
[ -x "$shared/bench/pg-reference" ] || shared=/work/shared
tck=$(getconf CLK_TCK)
# busy_ticks: the machine's CPU time so far, all CPUs, but for idle and iowait.
busy_ticks() { awk 'NR == 1 { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# pgbench_window: the machine's busy ticks and the milliseconds between the
# first and the last look (every 0.2 s) that found pgbench running: the
# steady part of a pg-reference run, without its scratch database's setup.
pgbench_window() {
	local b0='' t0='' b1=0 t1=0 b t
	for _ in $(seq 600); do
		if pgrep -x pgbench >/dev/null; then
			b=$(busy_ticks) t=$(date +%s%3N)
			[ -z "$b0" ] && b0=$b t0=$t
			b1=$b t1=$t
		elif [ -n "$b0" ]; then
			break
		fi
		sleep 0.2
	done
	echo "$((b1 - ${b0:-0})) $((t1 - ${t0:-0}))"
}

build() { # build SIDE REV: bin/pair-SIDE from REV ("" = the working tree)
	local side=$1 rev=$2
	if [ -z "$rev" ]; then
		"${GO:-go}" build -o "bin/pair-$side" ./cmd/payments
		return
	fi
	local tree
	tree=$(mktemp -d)
	git archive "$rev" | tar -x -C "$tree"
	(cd "$tree" && "${GO:-go}" build -o "$OLDPWD/bin/pair-$side" ./cmd/payments)
	rm -rf "$tree"
}
a_rev=${PAIR_A-$(git rev-parse --short HEAD~1)} b_rev=${PAIR_B-}
say "A = ${a_rev:-working tree} ${PAIR_A_ENV:-}, B = ${b_rev:-working tree} ${PAIR_B_ENV:-}; results in $out"
build A "$a_rev"
build B "$b_rev"
"${GO:-go}" build -o bin/paymentsbench ./cmd/paymentsbench

server_pid='' db=''
cleanup() {
	stop_service
	[ -n "$db" ] && psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1
	return 0
}
trap cleanup EXIT

# measure SIDE RELAY ROUND: one measurement, one JSON line into $out/SIDE-RELAY.jsonl.
measure() {
	local side=$1 relay=$2 round=$3 base query db_url
	db=bench_pair_$$_${side,,}_${relay}_$round # lower case: psql folds the name, pgx does not
	psql -qX "$admin" -c "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null
	base=${admin%%\?*} query=${admin#"$base"}
	[[ $query == "$admin" ]] && query=
	db_url="${base%/*}/$db$query"
	new_merchant "$db_url" "bin/pair-$side"
	local relay_env=true events=()
	[ "$relay" = off ] && relay_env=false
	[ "$relay" = on ] && [ -n "${PAIR_EVENTS:-}" ] && events=(-events-url "$NATS_URL")
	local side_env=PAIR_${side}_ENV
	# METRICS_SAMPLE as shipped (start_service samples every second for make bench).
	# shellcheck disable=SC2086 # the settings are words
	service_bin=bin/pair-$side start_service "$db_url" "$out/$side-$relay-$round.log" \
		METRICS_SAMPLE=15s RELAY_ENABLED=$relay_env ${!side_env:-}
	psql -qX "$admin" -c CHECKPOINT >/dev/null
	bin/paymentsbench -url "$url" -api-key "$api_key" -c "$clients" -d "${seconds}s" -accounts "$accounts" \
		-scenarios fresh -json -cpu -service-pid "$server_pid" -run-id "$side$relay$round" "${events[@]}" |
		sed "s/^{/{\"side\":\"$side\",\"relay\":\"$relay\",\"round\":$round,/" >>"$out/$side-$relay.jsonl"
	stop_service
	psql -qX "$admin" -c "DROP DATABASE $db" >/dev/null
	db=''
	tail -n 1 "$out/$side-$relay.jsonl" | jq -r --argjson tck "$tck" \
		'"\(.side) relay \(.relay) round \(.round): \(.charges_per_s) charges/s, p50 \(.p50_ms) ms, machine \(1000 * .cpu_ticks.machine / $tck / .charges * 1000 | round / 1000) ms/charge"' >&2
}

: >"$out/pg-reference.txt"
for round in $(seq "$rounds"); do
	order="A B"
	[ $((round % 2)) = 0 ] && order="B A"
	for side in $order; do
		for relay in $relays; do
			measure "$side" "$relay" "$round"
		done
	done
	pgbench_window >"$out/window" &
	tps=$("$shared/bench/pg-reference" -c "$clients" -T "$seconds" -d "$admin" | sed -n 's/^reference_tps=//p')
	wait
	read -r ticks ms <"$out/window"
	# The machine's CPU per reference transaction, pgbench included.
	echo "$tps $(awk -v b="$ticks" -v t="$tps" -v ms="$ms" -v hz="$tck" 'BEGIN { printf "%.3f", (ms > 0 && t > 0) ? 1000 * b / hz / (t * ms / 1000) : 0 }')" >>"$out/pg-reference.txt"
	say "round $round: pg-reference $(tail -n 1 "$out/pg-reference.txt") (tps, machine CPU ms per transaction)"
done

ref=$(cut -d' ' -f1 "$out/pg-reference.txt" | median)
ref_cpu=$(cut -d' ' -f2 "$out/pg-reference.txt" | median)
printf '\npg-reference median: %s tps, machine CPU %s ms per transaction (%s clients, %s s)\n\n' "$ref" "$ref_cpu" "$clients" "$seconds"
printf '| side | relay | charges/s | × pg-reference | p50 ms | event p99 ms | CPU ms per charge: machine | service | postgres | nats-server | load generator |\n'
printf '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for side in A B; do
	for relay in $relays; do
		jq -s -r --argjson tck "$tck" --argjson ref "$ref" --arg side "$side" --arg relay "$relay" '
			def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
			def ms(part): map(1000 * (.cpu_ticks[part] // 0) / $tck / .charges) | median * 1000 | round / 1000;
			(map(.charges_per_s) | median * 10 | round / 10) as $cps |
			(if all(.events) then map(.events.p99_ms) | median * 1000 | round / 1000 else "–" end) as $ev |
			"| \($side) | \($relay) | \($cps) | \($cps / $ref * 100 | round / 100) | \(map(.p50_ms) | median * 1000 | round / 1000) | \($ev) | \(ms("machine")) | \(ms("service")) | \(ms("postgres")) | \(ms("nats-server")) | \(ms("paymentsbench")) |"
		' "$out/$side-$relay.jsonl"
	done
done
