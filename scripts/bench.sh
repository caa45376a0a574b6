#!/usr/bin/env bash
# bench.sh: measure the service against the database's own ceiling, and every
# other target of issue 5, and write docs/benchmarks.md (`make bench` calls it).
#
#  1. Creates a scratch database payments_bench_<pid>, builds bin/payments and
#     bin/paymentsbench, migrates, creates a merchant.
#  2. Starts `payments serve` on a free loopback port (logs in bin/bench-server.log).
#  3. Runs ../shared/bench/pg-reference at the same concurrency: reference_tps.
#  4. Runs the scenarios fresh, replay, storm and mixed with bin/paymentsbench, each
#     verifying through the API that the balances match what succeeded; during the
#     storm it samples pg_stat_activity for the connections in use.
#  5. Heap: restarts the service and sends BENCH_HEAP_KEYS distinct keys (fresh, in
#     chunks, within BENCH_HEAP_BUDGET seconds), reading the heap from /metrics
#     after the first 10,000 keys, halfway and at the end, each time once settled.
#  6. Janitor: seeds BENCH_JANITOR_KEYS expired keys, runs fresh with a TTL under
#     which they are not expired (the janitor finds nothing), then restarts with
#     the default TTL so the janitor deletes them while fresh runs again.
#  7. Large table (unless BENCH_LARGE=0): on a second scratch database, fresh on
#     an empty table, then seeds BENCH_LARGE_KEYS live keys and runs fresh twice,
#     then truncates the table and runs fresh on it empty again.
#  8. Go benchmarks: the key claim overhead, the stored body size (zstd) and the
#     relay's commit-to-publish delay (issue 4).
#  9. Writes the report; stops the service and drops the scratch databases on exit.
#
# Environment:
#   BENCH_SECONDS        seconds per scenario and for the reference (default 10)
#   BENCH_CLIENTS        concurrent clients (default 16)
#   BENCH_LOG_LEVEL      LOG_LEVEL of the service (default info, as deployed)
#   BENCH_REPORT         where to write the report (default docs/benchmarks.md)
#   BENCH_HEAP_KEYS      distinct keys for the heap target (default 200000)
#   BENCH_HEAP_BUDGET    seconds the heap load may take before it stops early (default 480)
#   BENCH_JANITOR_KEYS   expired keys the janitor deletes (default 1000000)
#   BENCH_LARGE          1 (default): also measure fresh with BENCH_LARGE_KEYS keys in
#                        the table; 0 skips that (it takes about 3 of the ~8 minutes)
#   BENCH_LARGE_KEYS     keys seeded for that (default 5000000)
#   BENCH_CLAIM_COUNT    interleaved runs of the key claim benchmark (default 5)
#   PAYMENTS_BENCH_DATABASE_URL, else PAYMENTS_TEST_DATABASE_URL: a PostgreSQL
#     where this may CREATE DATABASE (default postgres://postgres@localhost:5432/postgres);
#     the Go benchmarks create theirs there too
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
heap_keys=${BENCH_HEAP_KEYS:-200000}
heap_budget=${BENCH_HEAP_BUDGET:-480}
janitor_keys=${BENCH_JANITOR_KEYS:-1000000}
large_default=1
large=${BENCH_LARGE:-$large_default}
large_keys=${BENCH_LARGE_KEYS:-5000000}
claim_count=${BENCH_CLAIM_COUNT:-5}
admin=${PAYMENTS_BENCH_DATABASE_URL:-${PAYMENTS_TEST_DATABASE_URL:-postgres://postgres@localhost:5432/postgres?sslmode=disable}}
for v in seconds clients heap_budget janitor_keys large_keys claim_count; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v (BENCH_${v^^}) must be a positive whole number, got '${!v}'"
done
[[ $heap_keys =~ ^[1-9][0-9]*$ ]] && [ "$heap_keys" -ge 20000 ] ||
	die "BENCH_HEAP_KEYS must be a whole number of at least 20000, got '$heap_keys'"
[[ $large =~ ^[01]$ ]] || die "BENCH_LARGE must be 0 or 1, got '$large'"

shared=../shared
[ -x "$shared/bench/pg-reference" ] || shared=/work/shared
[ -x "$shared/bench/pg-reference" ] ||
	die "pg-reference not found in ../shared/bench or /work/shared/bench"
for tool in "$GO" psql pgbench; do
	command -v "$tool" >/dev/null 2>&1 ||
		die "$tool is not installed (psql and pgbench: Debian/Ubuntu package postgresql-client)"
done

# The scratch databases sit on the admin server; their URLs keep the admin query.
db=payments_bench_$$
db_large=payments_bench_$$_large
base=${admin%%\?*} query=${admin#"$base"}
[[ $query == "$admin" ]] && query=
scratch="${base%/*}/$db$query"
scratch_large="${base%/*}/$db_large$query"
mkdir -p bin "$(dirname "$report")"
# What an earlier run left would otherwise mix with this run's logs and samples.
rm -f bin/bench-server*.log bin/bench-*.err bin/bench-heap-*.txt bin/bench-janitor-*.txt bin/bench-go-*.txt
server_log=bin/bench-server.log
results=bin/bench-results.jsonl
storm_samples=bin/bench-storm-activity.txt

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

server_pid='' sampler_pid='' metrics_sampler_pid='' port='' url='' nats_pid='' nats_dir=''
declare -A run_load=()
cleanup() {
	if [ -n "$sampler_pid" ]; then kill "$sampler_pid" 2>/dev/null || true; fi
	stop_metrics_sampler
	stop_service
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db_large WITH (FORCE)" >/dev/null 2>&1 || true
	if [ -n "$nats_pid" ]; then kill "$nats_pid" 2>/dev/null || true; wait "$nats_pid" 2>/dev/null || true; fi
	if [ -n "$nats_dir" ]; then rm -rf "$nats_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# field NAME RUN: a number or boolean from that run's JSON line in $results.
field() { grep "\"scenario\":\"$2\"" "$results" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
# errors RUN: its error counts by status, e.g. "402: 3, none: 1", or 0.
errors() {
	local e
	e=$(grep "\"scenario\":\"$1\"" "$results" | sed -n 's/.*"errors":{\([^}]*\)}.*/\1/p' |
		sed 's/"//g; s/:/: /g; s/,/, /g')
	echo "${e:-0}"
}
# ratio A B [DIGITS]: A / B.
ratio() { awk -v a="$1" -v b="$2" -v d="${3:-2}" 'BEGIN { if (b > 0) printf "%.*f", d, a / b; else print "n/a" }'; }
# verdict VALUE TARGET: met or not met, as VALUE >= TARGET; verdict_le: VALUE <= TARGET.
verdict() { awk -v v="$1" -v t="$2" 'BEGIN { print (v + 0 >= t + 0) ? "**met**" : "**not met**" }'; }
verdict_le() { awk -v v="$1" -v t="$2" 'BEGIN { print (v + 0 <= t + 0) ? "**met**" : "**not met**" }'; }

# --- 1. Scratch database, binaries, schema, merchant -------------------------------
say "scratch database $db"
psql -qX "$admin" -c "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null ||
	die "cannot create a database with $admin;" \
		"set PAYMENTS_BENCH_DATABASE_URL to a PostgreSQL where this user may CREATE DATABASE"
say "building bin/payments and bin/paymentsbench"
"$GO" build -o bin/payments ./cmd/payments
"$GO" build -o bin/paymentsbench ./cmd/paymentsbench

# The services' relays publish to a NATS of this run's own, on a random port,
# so benchmarks do not fill the machine's shared one; it goes with the run.
if command -v nats-server >/dev/null 2>&1; then
	nats_dir=$(mktemp -d)
	nats-server -a 127.0.0.1 -p -1 -js -sd "$nats_dir" -l "$nats_dir/nats.log" &
	nats_pid=$!
	for _ in $(seq 100); do
		nats_addr=$(sed -n 's/.*Listening for client connections on \([0-9.]*:[0-9]*\).*/\1/p' "$nats_dir/nats.log" 2>/dev/null | head -n 1 || true)
		[ -n "$nats_addr" ] && break
		sleep 0.1
	done
	[ -n "$nats_addr" ] || die "nats-server did not start; see $nats_dir/nats.log"
	export NATS_URL="nats://$nats_addr"
	say "private NATS (JetStream) at $NATS_URL for the relay"
else
	say "nats-server not found: the relay publishes to NATS_URL (default nats://127.0.0.1:4222)"
fi
# new_merchant DATABASE_URL: migrates and creates a merchant; sets api_key, merchant_id.
new_merchant() {
	local creds
	DATABASE_URL=$1 bin/payments migrate up >/dev/null
	creds=$(DATABASE_URL=$1 bin/payments merchants create --name bench)
	api_key=$(sed -n 's/.*"api_key"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$creds")
	merchant_id=$(sed -n 's/.*"merchant_id"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$creds")
	[ -n "$api_key" ] && [ -n "$merchant_id" ] ||
		die "no api_key or merchant_id in the output of 'payments merchants create': $creds"
}
new_merchant "$scratch"

# --- 2. The service, on a port the kernel picks --------------------------------------
start_service "$scratch" "$server_log"
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
stop_service

# --- 5. Heap after BENCH_HEAP_KEYS distinct keys ----------------------------------
# The bound: an idle service holds ~5 MiB; the replay cache at most 10,000
# responses of ~300 bytes plus their key, location, fingerprint and map/list
# entries, ~1 KiB each, ~10 MiB; coalescing state is freed per key. That is
# ~16 MiB live, and with GOGC=100 the heap may hold as much garbage again before
# the next collection: ~32 MiB, plus half again for slack.
heap_bound_mib=48
heap_runs=() heap_sent=0 heap_errors='?' hm_inuse='' hm_alloc='' hm_sent=''
relay_backlog='' relay_oldest='' h2_idle=''
heap_result='not measured' heap_figure=''
say "heap: a new service, then $heap_keys distinct keys (fresh, at most ${heap_budget}s of load)"
step_began=$SECONDS
start_service "$scratch" bin/bench-server-heap.log
if run_fresh heap-1 "$api_key" -n 10000; then
	heap_runs+=(heap-1)
	heap_sent=10000
	read -r _ _ h1_inuse h1_alloc h1_cache h1_flight _ _ _ _ _ h1_wait h1_ok < <(settle_heap bin/bench-heap-1.txt 90)
	say "  after the first 10,000 keys: heap in use $(mib "$h1_inuse") MiB, alloc $(mib "$h1_alloc") MiB, cache $h1_cache, in flight $h1_flight (settled in ${h1_wait}s: $h1_ok)"
	chunk=$(((heap_keys - 10000 + 3) / 4))
	i=1
	while [ "$heap_sent" -lt "$heap_keys" ] && [ $((SECONDS - step_began)) -lt "$heap_budget" ]; do
		i=$((i + 1))
		n=$((heap_keys - heap_sent < chunk ? heap_keys - heap_sent : chunk))
		run_fresh "heap-$i" "$api_key" -n "$n" || break
		heap_runs+=("heap-$i")
		heap_sent=$((heap_sent + n))
		# Once halfway, read it too: a slow leak grows at both steps alike.
		if [ -z "$hm_inuse" ] && [ $((2 * heap_sent)) -ge "$heap_keys" ] && [ "$heap_sent" -lt "$heap_keys" ]; then
			hm_sent=$heap_sent
			read -r _ _ hm_inuse hm_alloc _ _ _ _ _ _ _ _ _ < <(settle_heap bin/bench-heap-mid.txt 90)
			say "  after $hm_sent keys: heap in use $(mib "$hm_inuse") MiB, alloc $(mib "$hm_alloc") MiB"
		fi
	done
	read -r _ _ h2_inuse h2_alloc h2_cache h2_flight _ h2_gor _ _ h2_idle h2_wait h2_ok < <(settle_heap bin/bench-heap-2.txt 90)
	# What the relay had left to publish when the load stopped, and how old.
	read -r relay_backlog relay_oldest < <(head -n 1 bin/bench-heap-2.txt | cut -d' ' -f9,10)
	say "  after $heap_sent keys: heap in use $(mib "$h2_inuse") MiB, alloc $(mib "$h2_alloc") MiB, cache $h2_cache, in flight $h2_flight (idle after ${h2_idle}s, settled in ${h2_wait}s: $h2_ok)"
	heap_distinct=$((heap_sent + 2000 * ${#heap_runs[@]})) # each run also opens and funds 1,000 accounts
	heap_load_s=$(for r in "${heap_runs[@]}"; do field seconds "$r"; done | awk '{ s += $1 } END { printf "%.0f", s }')
	heap_errors=$(for r in "${heap_runs[@]}"; do field error_count "$r"; done | awk '{ s += $1 } END { print s + 0 }')
	# Unsettled, the heap only holds more garbage: the bound still applies.
	if [ "$h2_cache" -le 10000 ] && [ "$h2_flight" -eq 0 ]; then
		heap_result=$(verdict_le "$(mib "$h2_inuse")" "$heap_bound_mib")
	else
		heap_result='**not met**'
	fi
	[ "$heap_sent" -ge "$heap_keys" ] || heap_result="$heap_result (only $heap_sent of $heap_keys keys in the ${heap_budget}s budget)"
	settle_note=$([ "$h2_ok" = 1 ] && echo "settled ${h2_wait} s after the run" || echo "**not settled within 90 s** (idle after ${h2_idle} s; -1: never)")
	heap_figure="heap in use $(mib "$h2_inuse") MiB (bound $heap_bound_mib MiB), heap alloc $(mib "$h2_alloc") MiB, $settle_note, after $heap_distinct distinct keys; cache entries $h2_cache (≤ 10000), keys in flight $h2_flight (0 when idle), goroutines $h2_gor. After the first 10,000 keys: $(mib "$h1_inuse") MiB in use, $(mib "$h1_alloc") MiB alloc${hm_inuse:+; after $hm_sent: $(mib "$hm_inuse") MiB in use, $(mib "$hm_alloc") MiB alloc}"
else
	heap_figure="paymentsbench gave no result for the first 10,000 keys (bin/bench-heap-1.err)"
fi
stop_service
heap_step_s=$((SECONDS - step_began))

# --- 6. The janitor deleting BENCH_JANITOR_KEYS expired keys ----------------------
say "janitor: seeding $janitor_keys expired keys (created 25 h ago) into $db"
step_began=$SECONDS
janitor_result='not measured' janitor_figure='' janitor_seed_s='' janitor_detail=''
t=$SECONDS
if seed_keys "$scratch" "$merchant_id" expired 1 "$janitor_keys" \
	"now() - interval '25 hours' - i * (interval '1 hour' / $janitor_keys)" && after_seeding "$scratch"; then
	janitor_seed_s=$((SECONDS - t))
	expired_sql="SELECT count(*) FROM idempotency_keys WHERE created_at < now() - interval '24 hours'"
	say "  seeded in ${janitor_seed_s}s; without the janitor (IDEMPOTENCY_TTL=87600h: nothing is expired)"
	start_service "$scratch" bin/bench-server-janitor-off.log IDEMPOTENCY_TTL=87600h
	start_metrics_sampler bin/bench-janitor-off-metrics.txt 0.5
	off_ok=0
	run_fresh janitor-off "$api_key" -d "${seconds}s" && off_ok=1
	stop_metrics_sampler
	stop_service
	off_deleted=$(tail -n 1 bin/bench-janitor-off-metrics.txt | cut -d' ' -f7)
	expired_before=$(psql -XAt "$scratch" -c "$expired_sql")
	say "  with the janitor (IDEMPOTENCY_TTL=24h, JANITOR_INTERVAL=1m, JANITOR_BATCH=1000: it sweeps at start)"
	start_service "$scratch" bin/bench-server-janitor-on.log IDEMPOTENCY_TTL=24h JANITOR_INTERVAL=1m JANITOR_BATCH=1000
	start_metrics_sampler bin/bench-janitor-on-metrics.txt 0.5
	on_ok=0
	run_fresh janitor-on "$api_key" -d "${seconds}s" && on_ok=1
	stop_metrics_sampler
	stop_service
	expired_after=$(psql -XAt "$scratch" -c "$expired_sql")
	if [ "$off_ok" = 1 ] && [ "$on_ok" = 1 ]; then
		# From the samples: deleted before the clock started, during the run, and
		# until when the counter still rose.
		read -r del_before del_window active_ms window_ms < <(awk \
			-v from="$(field start_unix_ms janitor-on)" -v to="$(field end_unix_ms janitor-on)" '
			NF >= 7 {
				if ($1 <= from) before = $7
				if ($1 >= to && !ended) { after = $7; ended = 1 }
				if ($7 > last) { rose = $1 }
				last = $7
			}
			END {
				if (!ended) after = last
				active = (rose < to ? rose : to) - from
				printf "%d %d %d %d\n", before, after - before, (active > 0 ? active : 0), to - from
			}' bin/bench-janitor-on-metrics.txt)
		p99_off=$(field p99_ms janitor-off) p99_on=$(field p99_ms janitor-on)
		janitor_ratio=$(ratio "$p99_on" "$p99_off")
		active_pct=$(awk -v a="$active_ms" -v w="$window_ms" 'BEGIN { printf "%.0f", (w > 0 ? 100 * a / w : 0) }')
		if [ "$del_window" -le 0 ]; then
			janitor_result="not measured"
			janitor_figure="the janitor deleted nothing during the measured run ($del_before before it; $expired_after expired keys left), so this compares nothing"
		else
			janitor_result=$(verdict_le "$janitor_ratio" 2)
			janitor_figure="$janitor_ratio × (p99 $p99_on ms with the janitor deleting, $p99_off ms without); it deleted $del_window keys during the ${seconds} s run ($(ratio "$del_window" "$(awk -v w="$window_ms" 'BEGIN { print w / 1000 }')" 0) keys/s), and was still deleting for $active_pct % of it"
		fi
		janitor_detail="Without the janitor: payments_janitor_deleted_keys_total ${off_deleted:-?} at the end, $expired_before expired keys in the table after the run. With it: $del_before deleted during the service's start and the run's setup (opening 1,000 accounts), $del_window during the measured ${seconds} s (metrics sampled every 0.5 s, so ±0.5 s at either end), deleting for $active_pct % of the run; $expired_after of the $janitor_keys expired keys were left when the service stopped after the run."
	else
		janitor_figure="paymentsbench gave no result (bin/bench-janitor-*.err)"
	fi
else
	janitor_figure="seeding the expired keys failed (see above)"
fi
janitor_step_s=$((SECONDS - step_began))
# The large step uses its own database; this one is done.
psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true

# --- 7. Fresh charges with BENCH_LARGE_KEYS keys in the table (BENCH_LARGE) -------
large_result='not measured' large_figure='' large_detail=''
if [ "$large" = 1 ]; then
	say "large table: scratch database $db_large, fresh on an empty key table"
	step_began=$SECONDS
	psql -qX "$admin" -c "CREATE DATABASE $db_large TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null || die "cannot create $db_large"
	new_merchant "$scratch_large"
	start_service "$scratch_large" bin/bench-server-large.log
	large_ok=1
	run_fresh large-empty-1 "$api_key" -d "${seconds}s" || large_ok=0
	say "  seeding $large_keys live keys (created within the last 22 h) in batches of 1,000,000"
	t=$SECONDS
	from=1
	while [ "$large_ok" = 1 ] && [ "$from" -le "$large_keys" ]; do
		to=$((from + 999999 < large_keys ? from + 999999 : large_keys))
		seed_keys "$scratch_large" "$merchant_id" live "$from" "$to" \
			"now() - i * (interval '22 hours' / $large_keys)" || large_ok=0
		say "  seeded $to keys, $((SECONDS - t))s"
		from=$((to + 1))
	done
	large_seed_s=$((SECONDS - t))
	t=$SECONDS
	[ "$large_ok" = 1 ] && { after_seeding "$scratch_large" || large_ok=0; }
	large_vacuum_s=$((SECONDS - t))
	large_rows=$(psql -XAt "$scratch_large" -c 'SELECT count(*) FROM idempotency_keys')
	large_size=$(psql -XAt "$scratch_large" -c "SELECT pg_size_pretty(pg_total_relation_size('idempotency_keys'))")
	if [ "$large_ok" = 1 ]; then
		say "  $large_rows keys ($large_size with indexes); fresh again, twice"
		run_fresh large-full-1 "$api_key" -d "${seconds}s" || large_ok=0
		run_fresh large-full-2 "$api_key" -d "${seconds}s" || large_ok=0
	fi
	# The empty table once more, after the full one, so drift on a shared
	# machine falls on both sides of the comparison.
	if [ "$large_ok" = 1 ]; then
		say "  TRUNCATE idempotency_keys; fresh on the empty table again"
		psql -qX "$scratch_large" -c 'TRUNCATE idempotency_keys' -c 'CHECKPOINT' >/dev/null || large_ok=0
		run_fresh large-empty-2 "$api_key" -d "${seconds}s" || large_ok=0
	fi
	stop_service
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db_large WITH (FORCE)" >/dev/null 2>&1 || true
	large_step_s=$((SECONDS - step_began))
	if [ "$large_ok" = 1 ]; then
		p50_empty=$(for r in large-empty-1 large-empty-2; do field p50_ms "$r"; done | awk '{ s += $1 } END { printf "%.3f", s / NR }')
		p50_full=$(for r in large-full-1 large-full-2; do field p50_ms "$r"; done | awk '{ s += $1 } END { printf "%.3f", s / NR }')
		large_ratio=$(ratio "$p50_full" "$p50_empty")
		large_result=$(verdict_le "$large_ratio" 1.3)
		large_figure="$large_ratio × (p50 $p50_full ms with $large_rows keys in the table, $p50_empty ms with it empty; each the mean of two ${seconds} s runs, the empty ones before and after the full ones)"
		large_detail="A second scratch database, its own service. \"large-empty-1\": fresh on an empty key table (p50 $(field p50_ms large-empty-1) ms); then $large_keys keys seeded in ${large_seed_s}s (one INSERT … SELECT FROM generate_series per 1,000,000, UUID-shaped keys in random order, ~280-byte bodies, created within the last 22 h so none is expired), VACUUM (ANALYZE) and CHECKPOINT in ${large_vacuum_s}s (autovacuum is $(psql -XAt "$admin" -c 'SHOW autovacuum') on this server): $large_rows keys, $large_size with indexes; \"large-full-1\" and \"-2\": fresh again (p50 $(field p50_ms large-full-1) and $(field p50_ms large-full-2) ms); then TRUNCATE idempotency_keys and \"large-empty-2\" (p50 $(field p50_ms large-empty-2) ms), so the empty table is measured on both sides of the full one: the load of a shared machine drifts over the minutes between (see the load column). The step took ${large_step_s}s."
	else
		large_figure="a run or the seeding failed (see bin/bench-large-*.err and the output above)"
	fi
else
	large_figure="skipped in this run (BENCH_LARGE=0): it seeds $large_keys keys, about 3 minutes more; \`make bench\` runs it by default"
fi

# --- 8. Go benchmarks ------------------------------------------------------------
# go_bench NAME PKG ARGS...: runs one benchmark on the admin server's scratch
# databases; its output goes to bin/bench-go-NAME.txt. Fails when go test does.
go_bench() {
	local name=$1 pkg=$2
	shift 2
	PAYMENTS_TEST_DATABASE_URL=$admin timeout 600 "$GO" test -run '^$' -bench "$name" -timeout 9m "$@" "$pkg" \
		>"bin/bench-go-$name.txt" 2>&1
}
# go_metric FILE UNIT: the value reported before UNIT on a Benchmark line.
go_metric() { awk -v u="$2" '/^Benchmark/ { for (i = 3; i <= NF; i++) if ($i == u) print $(i - 1) }' "$1"; }
# go_failure FILE: the first lines that say why go test failed.
go_failure() { grep -v -E '^(goos|goarch|pkg|cpu|pgtest):' "$1" | head -n 3 | tr '\n' ' ' | cut -c1-300; }

say "go benchmark KeyClaimOverhead, -benchtime 10000x -count $claim_count (with and without the claim, interleaved)"
claim_result='not measured' claim_figure=''
if go_bench KeyClaimOverhead ./internal/postgres/ -benchtime 10000x -count "$claim_count"; then
	f=bin/bench-go-KeyClaimOverhead.txt
	with_all=$(awk '$1 ~ /\/with-claim/ { print $3 }' "$f" | tr '\n' ' ')
	without_all=$(awk '$1 ~ /\/without-claim/ { print $3 }' "$f" | tr '\n' ' ')
	with_ns=$(tr ' ' '\n' <<<"$with_all" | grep . | median)
	without_ns=$(tr ' ' '\n' <<<"$without_all" | grep . | median)
	if [ -n "$with_ns" ] && [ -n "$without_ns" ]; then
		claim_pct=$(awk -v a="$with_ns" -v b="$without_ns" 'BEGIN { printf "%.1f", (a / b - 1) * 100 }')
		claim_result=$(verdict_le "$claim_pct" 10)
		claim_figure="$claim_pct % (median $with_ns ns/op with the claim, $without_ns ns/op without, over $claim_count interleaved runs of 10,000 charges by 16 parallel clients; each run: with ${with_all% }, without ${without_all% })"
		# How far the runs of one variant lie apart: the noise this figure sits in.
		claim_spread=$(for runs in "$with_all" "$without_all"; do
			tr ' ' '\n' <<<"$runs" | grep . | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f\n", (hi / lo - 1) * 100 }'
		done | sort -g | tail -n 1)
		[ "$claim_spread" -le 10 ] ||
			claim_figure="$claim_figure; the runs of one variant lie up to $claim_spread % apart, more than the 10 % at stake, so on this shared machine the verdict is within the noise"
	else
		claim_figure="go test printed no ns/op figures (bin/bench-go-KeyClaimOverhead.txt)"
	fi
else
	claim_figure="go test failed: $(go_failure bin/bench-go-KeyClaimOverhead.txt)"
fi
say "  key claim overhead: $claim_result $claim_figure"

body_result='not measured yet' body_figure='BenchmarkStoredBodySize does not exist yet in internal/postgres'
if grep -q 'func BenchmarkStoredBodySize' internal/postgres/*_test.go 2>/dev/null; then
	say "go benchmark StoredBodySize"
	if go_bench StoredBodySize ./internal/postgres/ -benchtime 1x; then
		f=bin/bench-go-StoredBodySize.txt
		raw=$(go_metric "$f" raw-bytes | xargs -r printf '%.0f')
		stored=$(go_metric "$f" stored-bytes | xargs -r printf '%.0f')
		plain=$(go_metric "$f" stored-plain-bytes | xargs -r printf '%.0f')
		if [ -n "$raw" ] && [ -n "$stored" ]; then
			body_result=$(verdict_le "$stored" "$(awk -v p="${plain:-$raw}" 'BEGIN { print p - 1 }')")
			body_figure="a $raw-byte charge response is stored in $stored bytes zstd-compressed ($(ratio "$raw" "$stored" 1) × smaller than raw)"
			[ -z "$plain" ] || body_figure="$body_figure; stored as is it takes $plain bytes after PostgreSQL's own TOAST compression, so zstd saves $(awk -v p="$plain" -v s="$stored" 'BEGIN { printf "%.0f", 100 * (1 - s / p) }') % more"
		else
			body_result='not measured' body_figure="go test printed no raw-bytes/stored-bytes (bin/bench-go-StoredBodySize.txt)"
		fi
	else
		body_result='not measured' body_figure="go test failed: $(go_failure bin/bench-go-StoredBodySize.txt)"
	fi
	say "  stored body size: $body_result $body_figure"
fi

say "go benchmark CommitToPublish (relay delay, issue 4; 200 charges/s for 10 s)"
relay_ok=0 relay_p50='' relay_p99='' relay_max='' relay_events='' relay_failure=''
if go_bench CommitToPublish ./internal/relay/ -benchtime 1x; then
	f=bin/bench-go-CommitToPublish.txt
	relay_p50=$(go_metric "$f" p50-ms) relay_p99=$(go_metric "$f" p99-ms)
	relay_max=$(go_metric "$f" max-ms) relay_events=$(go_metric "$f" events)
	[ -n "$relay_p50" ] && [ -n "$relay_p99" ] && relay_ok=1
	[ "$relay_ok" = 1 ] || relay_failure="go test printed no p50-ms/p99-ms (bin/bench-go-CommitToPublish.txt)"
else
	relay_failure="go test failed: $(go_failure bin/bench-go-CommitToPublish.txt)"
fi
say "  relay delay: p50 ${relay_p50:-?} ms, p99 ${relay_p99:-?} ms, max ${relay_max:-?} ms $relay_failure"

# --- 9. The report -------------------------------------------------------------------
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
warnings=$(log_warnings bin/bench-server*.log)

mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null || echo unknown)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
pg_version=$(psql -XAt "$admin" -c 'SHOW server_version')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit with uncommitted changes"
elapsed=$((SECONDS - began))
# The command that reproduces this run: the settings that differ from the defaults.
repro="BENCH_SECONDS=$seconds BENCH_CLIENTS=$clients"
[ "$large" = "$large_default" ] || repro+=" BENCH_LARGE=$large"
[ "$heap_keys" = 200000 ] || repro+=" BENCH_HEAP_KEYS=$heap_keys"
[ "$heap_budget" = 480 ] || repro+=" BENCH_HEAP_BUDGET=$heap_budget"
[ "$janitor_keys" = 1000000 ] || repro+=" BENCH_JANITOR_KEYS=$janitor_keys"
[ "$large_keys" = 5000000 ] || repro+=" BENCH_LARGE_KEYS=$large_keys"
[ "$claim_count" = 5 ] || repro+=" BENCH_CLAIM_COUNT=$claim_count"

# row RUN [LOAD]: one line of a results table; LOAD adds a last column.
row() {
	local s=$1 verified
	verified=$([ "$(field verified "$s")" = true ] && echo "verified" || echo "**MISMATCH**")
	printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |' "$s" \
		"$(field requests "$s")" "$(field req_per_s "$s")" "$(field charges_per_s "$s")" \
		"$(field replays_per_s "$s")" "$(field p50_ms "$s")" "$(field p95_ms "$s")" \
		"$(field p99_ms "$s")" "$(field max_ms "$s")" "$(field in_use "$s")" "$(errors "$s")" "$verified"
	if [ $# -gt 1 ]; then printf ' %s |' "$2"; fi
	printf '\n'
}
table_head='| run | requests | req/s | new charges/s | replays/s | p50 ms | p95 ms | p99 ms | max ms | 409 in use | errors | balances |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|'

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

${table_head/run/scenario}
EOF
	for s in fresh replay storm mixed; do row "$s"; done
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
| key claim overhead ≤ 10 % (Go benchmark) | $claim_result | $claim_figure |
| storm of $clients clients on one key: one pooled connection for that key | $storm_result | $storm_figure |
| janitor deleting $janitor_keys expired keys: fresh p99 ≤ 2 × p99 without it | $janitor_result | $janitor_figure |
| fresh p50 with $large_keys keys ≤ 1.3 × empty table | $large_result | $large_figure |
| heap after $heap_keys distinct keys settles under a stated bound ($heap_bound_mib MiB in use) | $heap_result | $heap_figure |
| stored bodies over 1 KiB compressed (zstd) where it saves space | $body_result | $body_figure |

### Why a target is missed

When **fresh charges/s** falls short of 0.6 × the reference: pg-reference is one
SQL statement sent by pgbench, a C client, straight to PostgreSQL. A charge
through the service is the same single statement and single round trip (the
debit, the key claim, the charge and its event together), but around it come
HTTP, authentication, strict JSON decoding and canonicalisation, rendering and
an access-log line, in a Go process that shares the machine's 2 cores with
PostgreSQL and with the Go load generator. Measured with the same load: about
0.46 ms of PostgreSQL CPU per charge (the statement maintains 8 index entries
and a foreign-key check where the reference maintains 3) and 0.30 ms in the
service. What is left to take: fewer indexes (ordering charges and events by
their UUIDv7 keys instead of separate sequences), no charges → accounts foreign
key, a cheaper access log. None is taken yet.

When the **key claim overhead** lands above 10 %: the claim is one index entry
(plus the retention index) inside the same statement, no round trip of its own,
and the spread between runs of one variant on this shared machine (given in its
row) is wider than the 10 % at stake: the verdict flips between runs, so read it
on a quiet machine.

The runs behind the last rows, with the same columns as above (every one checks
the balances afterwards, as the scenarios do), and the 1-minute load average
of the machine when each ended:

$(sed '1s/$/ load |/; 2s/$/---:|/' <<<"$table_head")
EOF
	for r in "${heap_runs[@]}" janitor-off janitor-on large-empty-1 large-full-1 large-full-2 large-empty-2; do
		if grep -q "\"scenario\":\"$r\"" "$results"; then row "$r" "${run_load[$r]:-?}"; fi
	done
	cat <<EOF

### How the further targets are measured

**Key claim overhead.** \`go test -run '^\$' -bench KeyClaimOverhead -benchtime 10000x -count $claim_count ./internal/postgres/\`
runs the charge statement with and without the key claim (16 parallel clients, a
scratch database on the same server), the two alternating $claim_count times; the
overhead is the ratio of the medians, minus one.

**Janitor.** $janitor_keys expired keys (created 25 to 26 h ago, UUID-shaped keys,
~280-byte bodies, 32-byte fingerprints, status 201) were seeded into the scratch
database in one INSERT … SELECT FROM generate_series (${janitor_seed_s:-?}s, then VACUUM
(ANALYZE) and CHECKPOINT, so neither lands in a measured run). "janitor-off": the
service restarted with IDEMPOTENCY_TTL=87600h, so its janitor finds nothing
expired; "janitor-on": restarted with the defaults (IDEMPOTENCY_TTL=24h,
JANITOR_INTERVAL=1m, JANITOR_BATCH=1000, 10 ms between batches), so it starts
sweeping them at once, while fresh runs. $janitor_detail

**Large table.** ${large_detail:-Not run: BENCH_LARGE=0 skips it (it takes about 3 minutes).}

**Heap.** A new service process; "heap-1" sends the first 10,000 distinct keys,
then the heap is read from \`/metrics\` once it has settled; the next runs bring it
to ${heap_sent} keys (plus 2,000 per run for opening and funding the accounts:
${heap_distinct:-?} distinct keys, ${heap_load_s:-?} s of load, $heap_errors errors), and the heap is read again.
"Settled": /metrics polled every 0.1 s until the service was idle (the relay
had published the outbox backlog the run left, payments_outbox_backlog_events
0) and then two GC cycles completed (go_gc_duration_seconds_count; at idle
only the scrapes allocate, so the runtime keeps collecting; the second cycle
frees what sync.Pool's victim cache kept); the figures are the first sample
after that (samples in bin/bench-heap-1.txt, -mid.txt and -2.txt). It is read
after the first 10,000 keys, halfway and at the end. The bound, $heap_bound_mib MiB of
go_memstats_heap_inuse_bytes: an idle service holds ~5 MiB; the replay cache at
most 10,000 completed responses (~300-byte bodies plus key, location,
fingerprint and map and list entries: ~1 KiB each, ~10 MiB); the coalescing
state is freed per key, so nothing else grows with the keys: ~16 MiB live, up
to as much again in garbage between collections under GOGC=100, plus half again
for slack. A per-key leak of even 100 bytes would add
$(awk -v k="${heap_distinct:-200000}" 'BEGIN { printf "%.0f", k * 100 / 1048576 }') MiB over this run; compare
the heap after the first 10,000 keys with the heap at the end.

**Stored body compression.** \`go test -run '^\$' -bench StoredBodySize -benchtime 1x ./internal/postgres/\`
stores one large charge response as is and zstd-compressed and reads back
\`pg_column_size\` of each.

## Relay delay (issue 4)

EOF
	if [ "$relay_ok" = 1 ]; then
		cat <<EOF
| p50 ms | p99 ms | max ms | events |
|---:|---:|---:|---:|
| $relay_p50 | $relay_p99 | $relay_max | $relay_events |

From each charge event's \`created_at\` (its transaction's start, so a little
before the commit) to a NATS subscriber receiving it, under a steady 200
charges/s for 10 s, with LISTEN/NOTIFY waking the relay and its 1 s poll as the
fallback. The benchmark starts its own embedded NATS (JetStream) and a scratch
database on the server above:

    go test -run '^\$' -bench CommitToPublish -benchtime 1x ./internal/relay/
EOF
		if [ -n "$relay_backlog" ]; then
			cat <<EOF

Under heavier load, from the service's own metrics: when the heap step's fresh
load (runs heap-2 to heap-${#heap_runs[@]} above, $(for r in "${heap_runs[@]:1}"; do field charges_per_s "$r"; done | awk '{ s += $1 } END { printf "%.0f", NR ? s / NR : 0 }') charges/s on average, the relay
publishing to the run's own NATS) stopped, the outbox held
$relay_backlog unpublished events (payments_outbox_backlog_events), the oldest $relay_oldest s
old (payments_outbox_oldest_unpublished_seconds); all were published ${h2_idle} s later
(-1: not within 90 s).
EOF
		fi
	else
		printf 'Not measured in this run: %s\n\n    go test -run '"'"'^$'"'"' -bench CommitToPublish -benchtime 1x ./internal/relay/\n' "$relay_failure"
	fi
	cat <<EOF

## Machine

| | |
|---|---|
| date | $(date -u '+%Y-%m-%d %H:%M UTC') |
| CPU | $(nproc) × ${cpu:-unknown} |
| memory | $mem |
| OS | $(uname -sr) |
| load average | $load_before before the run, $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown) after (1, 5, 15 min; anything else running shares the CPUs) |
| PostgreSQL | $pg_version (server), the same server for pg-reference, the service and the Go benchmarks |
| Go | $("$GO" version | sed 's/^go version //') |
| commit | $commit |
| service | \`payments serve\`, defaults (DB_MAX_CONNS 20, IDEMPOTENCY_CACHE_SIZE 10000, LOG_LEVEL ${BENCH_LOG_LEVEL:-info}, logs to files bin/bench-server*.log; its relay publishes to a NATS server of the run's own, \`nats-server -js\` on a random loopback port), except IDEMPOTENCY_TTL in janitor-off |
| service warnings | ${warnings:-none} (WARN and ERROR lines in the service logs, "NATS disconnected" at shutdown aside) |
| run time | $elapsed s for the whole \`$repro make bench\` (heap $heap_step_s s, janitor $janitor_step_s s${large_step_s:+, large table $large_step_s s}) |

## Reproduce

    $repro make bench

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
sed -n '/^| target/,/^$/p' "$report" >&2
[ ${#failed[@]} -eq 0 ] || die "balances did not match in: ${failed[*]} (see $report and $results)"
