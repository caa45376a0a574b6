#!/usr/bin/env bash
# bench.sh: measure the service against the database's own ceiling and write
# docs/benchmarks.md (`make bench` calls it).
#
#  1. Creates a scratch database payments_bench_<pid>, builds bin/payments and
#     bin/paymentsbench, migrates, creates a merchant.
#  2. Starts `payments serve` on a free loopback port (logs in bin/bench-server.log).
#  3. Runs ../shared/bench/pg-reference at the same concurrency: reference_tps.
#  4. Runs the scenarios fresh, replay, storm and mixed with bin/paymentsbench, each
#     verifying through the API that the balances match what succeeded; during the
#     storm it samples pg_stat_activity for the connections in use.
#  5. Writes the report; stops the service and drops the scratch database on exit.
#
# Environment:
#   BENCH_SECONDS    seconds per scenario and for the reference (default 10)
#   BENCH_CLIENTS    concurrent clients (default 16)
#   BENCH_LOG_LEVEL  LOG_LEVEL of the service (default info, as deployed)
#   BENCH_REPORT     where to write the report (default docs/benchmarks.md)
#   PAYMENTS_BENCH_DATABASE_URL, else PAYMENTS_TEST_DATABASE_URL: a PostgreSQL
#     where this may CREATE DATABASE (default postgres://postgres@localhost:5432/postgres)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'bench: %s\n' "$*" >&2; }
die() {
	printf 'bench: %s\n' "$@" >&2
	exit 1
}

began=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
GO=${GO:-go}
seconds=${BENCH_SECONDS:-10}
clients=${BENCH_CLIENTS:-16}
report=${BENCH_REPORT:-docs/benchmarks.md}
admin=${PAYMENTS_BENCH_DATABASE_URL:-${PAYMENTS_TEST_DATABASE_URL:-postgres://postgres@localhost:5432/postgres?sslmode=disable}}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "BENCH_SECONDS must be a whole number of seconds, got '$seconds'"
[[ $clients =~ ^[1-9][0-9]*$ ]] || die "BENCH_CLIENTS must be a positive whole number, got '$clients'"

shared=../shared
[ -x "$shared/bench/pg-reference" ] || shared=/work/shared
[ -x "$shared/bench/pg-reference" ] ||
	die "pg-reference not found in ../shared/bench or /work/shared/bench"
for tool in "$GO" psql pgbench; do
	command -v "$tool" >/dev/null 2>&1 ||
		die "$tool is not installed (psql and pgbench: Debian/Ubuntu package postgresql-client)"
done

# The scratch database sits on the admin server; its URL keeps the admin query.
db=payments_bench_$$
base=${admin%%\?*} query=${admin#"$base"}
[[ $query == "$admin" ]] && query=
scratch="${base%/*}/$db$query"
mkdir -p bin "$(dirname "$report")"
server_log=bin/bench-server.log
results=bin/bench-results.jsonl
storm_samples=bin/bench-storm-activity.txt

server_pid='' sampler_pid=''
cleanup() {
	if [ -n "$sampler_pid" ]; then kill "$sampler_pid" 2>/dev/null || true; fi
	if [ -n "$server_pid" ]; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. Scratch database, binaries, schema, merchant -------------------------------
say "scratch database $db"
psql -qX "$admin" -c "CREATE DATABASE $db" >/dev/null ||
	die "cannot create a database with $admin;" \
		"set PAYMENTS_BENCH_DATABASE_URL to a PostgreSQL where this user may CREATE DATABASE"
say "building bin/payments and bin/paymentsbench"
"$GO" build -o bin/payments ./cmd/payments
"$GO" build -o bin/paymentsbench ./cmd/paymentsbench
DATABASE_URL=$scratch bin/payments migrate up >/dev/null
creds=$(DATABASE_URL=$scratch bin/payments merchants create --name bench)
api_key=$(sed -n 's/.*"api_key"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$creds")
[ -n "$api_key" ] || die "no api_key in the output of 'payments merchants create': $creds"

# --- 2. The service, on a port the kernel picks --------------------------------------
DATABASE_URL=$scratch HTTP_ADDR=127.0.0.1:0 LOG_LEVEL=${BENCH_LOG_LEVEL:-info} \
	bin/payments serve >"$server_log" 2>&1 &
server_pid=$!
addr=''
for _ in $(seq 100); do
	addr=$(sed -n 's/.*"msg":"listening".*"addr":"\([^"]*\)".*/\1/p' "$server_log" | head -n 1)
	[ -n "$addr" ] && break
	kill -0 "$server_pid" 2>/dev/null || break
	sleep 0.1
done
[ -n "$addr" ] || die "payments serve did not start listening; the end of $server_log:" "$(tail -n 20 "$server_log")"
port=${addr##*:}
url="http://127.0.0.1:$port"

# ready: whether GET /readyz answers 200 (bash's /dev/tcp, so curl is not needed).
ready() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
		printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
		read -r _ status _ <&3
		[ "$status" = 200 ]
	) 2>/dev/null
}
for _ in $(seq 100); do ready && break; sleep 0.1; done
ready || die "$url/readyz did not answer 200 within 10s; see $server_log"
say "service ready at $url (log: $server_log)"

# --- 3. The database's ceiling -------------------------------------------------------
say "pg-reference -c $clients -T $seconds"
ref_out=$("$shared/bench/pg-reference" -c "$clients" -T "$seconds" -d "$admin") ||
	die "pg-reference failed: $ref_out"
reference_tps=$(sed -n 's/^reference_tps=//p' <<<"$ref_out" | awk '{ printf "%.1f", $1 }')
reference_lat=$(sed -n 's/.*latency_avg_ms=\([0-9.]*\).*/\1/p' <<<"$ref_out")
say "reference_tps=$reference_tps"

# --- 4. The scenarios ----------------------------------------------------------------
# During the storm every client sends the same key. A connection used for that key
# while another holds it waits on a lock in idempotency_keys, so the connections
# used for one key are those waiters plus the holder. Each sample is
# "unix_ms busy_connections key_lock_waiters"; only those in the measured run count.
start_sampler() {
	printf '%s\n' "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint," \
		"count(*) FILTER (WHERE state <> 'idle')," \
		"count(*) FILTER (WHERE wait_event_type = 'Lock' AND query LIKE '%idempotency_keys%')" \
		"FROM pg_stat_activity WHERE datname = '$db' \\watch 0.1" |
		psql -qXAt -F' ' "$admin" >"$storm_samples" 2>/dev/null &
	sampler_pid=$!
}
stop_sampler() {
	kill "$sampler_pid" 2>/dev/null || true
	wait "$sampler_pid" 2>/dev/null || true
	sampler_pid=''
}

: >"$results"
failed=()
for scenario in fresh replay storm mixed; do
	say "scenario $scenario: $clients clients, ${seconds}s"
	[ "$scenario" = storm ] && start_sampler
	rc=0
	PAYMENTS_API_KEY=$api_key bin/paymentsbench -url "$url" -c "$clients" -d "${seconds}s" \
		-scenarios "$scenario" -json >>"$results" || rc=$?
	[ "$scenario" = storm ] && stop_sampler
	if [ "$rc" -ne 0 ]; then
		grep -q "\"scenario\":\"$scenario\"" "$results" ||
			die "paymentsbench failed in scenario $scenario before measuring (see above)"
		failed+=("$scenario")
	fi
done

# --- 5. The report -------------------------------------------------------------------
# field NAME SCENARIO: a number or boolean from that scenario's JSON line.
field() { grep "\"scenario\":\"$2\"" "$results" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
# errors SCENARIO: its error counts by status, e.g. "402: 3, none: 1", or 0.
errors() {
	local e
	e=$(grep "\"scenario\":\"$1\"" "$results" | sed -n 's/.*"errors":{\([^}]*\)}.*/\1/p' |
		sed 's/"//g; s/:/: /g; s/,/, /g')
	echo "${e:-0}"
}
# ratio A B [DIGITS]: A / B.
ratio() { awk -v a="$1" -v b="$2" -v d="${3:-2}" 'BEGIN { if (b > 0) printf "%.*f", d, a / b; else print "n/a" }'; }
# verdict VALUE TARGET: met or not met, as VALUE >= TARGET.
verdict() { awk -v v="$1" -v t="$2" 'BEGIN { print (v + 0 >= t + 0) ? "**met**" : "**not met**" }'; }

fresh_cps=$(field charges_per_s fresh)
replay_rps=$(field replays_per_s replay)
fresh_ratio=$(ratio "$fresh_cps" "$reference_tps")
replay_ratio=$(ratio "$replay_rps" "$fresh_cps")
read -r storm_busy_max storm_locks_max storm_busy_mean storm_n < <(awk \
	-v from="$(field start_unix_ms storm)" -v to="$(field end_unix_ms storm)" '
	NF == 3 && $1 >= from && $1 <= to { n++; sum += $2; if ($2 > b) b = $2; if ($3 > l) l = $3 }
	END { printf "%d %d %.1f %d\n", b, l, n ? sum / n : 0, n }' "$storm_samples")
if [ "$storm_n" -eq 0 ]; then
	storm_result="not measured" storm_figure="pg_stat_activity gave no samples during the storm"
else
	storm_result=$([ "$storm_locks_max" -eq 0 ] && echo "**met**" || echo "**not met**")
	storm_figure="at most $((storm_locks_max + 1)) connection(s) seen for one key: the one holding it, plus $storm_locks_max waiting on its lock in idempotency_keys ($storm_busy_max busy in all, mean $storm_busy_mean); pg_stat_activity sampled every 0.1 s ($storm_n samples), so a short burst can slip between samples"
fi

mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null || echo unknown)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
pg_version=$(psql -XAt "$admin" -c 'SHOW server_version')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit with uncommitted changes"
elapsed=$((SECONDS - began))

mkdir -p "$(dirname "$report")"
{
	cat <<EOF
# Benchmarks

Generated by \`make bench\` (\`scripts/bench.sh\`); do not edit by hand. Issue 5 sets
the targets. The service, PostgreSQL, the load generator and pgbench all ran on
the machine below in the same run, so the ratios matter more than the absolute
figures, which drift from run to run on a small shared machine.

## Results

$clients concurrent clients, ${seconds} s per scenario, charges of 100 spread at random over
1,000 accounts per scenario (as pg-reference spreads them). Latencies are per
request, measured by the client over HTTP on loopback.

| scenario | requests | req/s | new charges/s | replays/s | p50 ms | p95 ms | p99 ms | max ms | 409 in use | errors | balances |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|
EOF
	for s in fresh replay storm mixed; do
		verified=$([ "$(field verified "$s")" = true ] && echo "verified" || echo "**MISMATCH**")
		printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$s" \
			"$(field requests "$s")" "$(field req_per_s "$s")" "$(field charges_per_s "$s")" \
			"$(field replays_per_s "$s")" "$(field p50_ms "$s")" "$(field p95_ms "$s")" \
			"$(field p99_ms "$s")" "$(field max_ms "$s")" "$(field in_use "$s")" "$(errors "$s")" "$verified"
	done
	cat <<EOF
| pg-reference (pgbench) | | $reference_tps | $reference_tps | | avg $reference_lat | | | | | | |

- **fresh charges/s ÷ reference_tps = $fresh_ratio** ($fresh_cps / $reference_tps)
- **replays/s ÷ fresh charges/s = $replay_ratio** ($replay_rps / $fresh_cps)

What the scenarios send: **fresh** a new Idempotency-Key per request;
**replay** the exact requests of 1,000 charges completed before the clock starts;
**storm** every client sends the same request, moving to a new key every 64
requests; **mixed** 70 % fresh charges, 30 % retries of one of the last 1,024 keys.
"new charges/s" counts 201s without \`Idempotent-Replayed\`, "replays/s" those with it;
"errors" counts answers other than 201 and 409 by status ("none": no HTTP answer).

"balances verified": after each scenario the load generator resends every key that
got no final answer (none, 409, 5xx) until it does, then reads every account
through \`GET /v1/accounts/{id}\` and checks balance = deposits − the amounts of the
distinct keys answered 201, and that every answer for a key names the same charge:
no charge was lost or made twice.

## Targets (issue 5)

| target | result | figure |
|---|---|---|
| fresh charges/s ≥ 0.6 × reference_tps | $(verdict "$fresh_ratio" 0.6) | $fresh_ratio × ($fresh_cps charges/s vs reference_tps $reference_tps) |
| replays/s ≥ 2 × fresh charges/s | $(verdict "$replay_ratio" 2) | $replay_ratio × ($replay_rps replays/s vs $fresh_cps fresh charges/s) |
| key claim overhead ≤ 10 % (Go benchmark) | not measured yet | no Go benchmark of the charge with and without the key claim exists yet |
| storm of $clients clients on one key: one pooled connection for that key | $storm_result | $storm_figure |
| janitor deleting 1,000,000 expired keys: fresh p99 ≤ 2 × p99 without it | not measured yet | nothing seeds 1,000,000 expired keys and runs fresh charges with and without the janitor yet |
| fresh p50 with 5,000,000 keys ≤ 1.3 × empty table | not measured yet | nothing seeds 5,000,000 keys into the key table before a fresh run yet |
| heap after 200,000 distinct keys settles under a stated bound | not measured yet | the service exposes no heap figure yet (no /metrics or pprof), and no bound is stated |

## Machine

| | |
|---|---|
| date | $(date -u '+%Y-%m-%d %H:%M UTC') |
| CPU | $(nproc) × ${cpu:-unknown} |
| memory | $mem |
| OS | $(uname -sr) |
| load average | $load_before before the run, $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown) after (1, 5, 15 min; anything else running shares the CPUs) |
| PostgreSQL | $pg_version (server), the same server for pg-reference and the service |
| Go | $("$GO" version | sed 's/^go version //') |
| commit | $commit |
| service | \`payments serve\`, defaults (DB_MAX_CONNS 20, LOG_LEVEL ${BENCH_LOG_LEVEL:-info}, logs to a file) |
| run time | $elapsed s for the whole \`make bench\` |

## Reproduce

    BENCH_SECONDS=$seconds BENCH_CLIENTS=$clients make bench

or, against a service already running:

    PAYMENTS_API_KEY=sk_... bin/paymentsbench -url http://127.0.0.1:8080 -c $clients -d ${seconds}s
    ../shared/bench/pg-reference -c $clients -T $seconds
EOF
	if [ ${#failed[@]} -gt 0 ]; then
		printf '\n## Verification failures\n\nThe balances did not match in: %s. What paymentsbench reported:\n\n' "${failed[*]}"
		for s in "${failed[@]}"; do
			printf '    %s: %s\n' "$s" "$(grep "\"scenario\":\"$s\"" "$results" | sed -n 's/.*"mismatches":\(\[.*\]\).*/\1/p' | cut -c1-2000)"
		done
	fi
} >"$report"

say "wrote $report in ${elapsed}s: fresh/reference $fresh_ratio, replay/fresh $replay_ratio"
sed -n '/^| scenario/,/^| pg-reference/p' "$report" >&2
[ ${#failed[@]} -eq 0 ] || die "balances did not match in: ${failed[*]} (see $report and $results)"
