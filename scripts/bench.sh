#!/usr/bin/env bash
# bench.sh: measure the service against the database's own ceiling, every
# other target of issue 5 and the group-commit targets of issue 12, and write
# docs/benchmarks.md (`make bench` calls it).
#
#  1. Creates a scratch database payments_bench_<pid>, builds bin/payments and
#     bin/paymentsbench, migrates, creates a merchant. Builds the baseline
#     (BENCH_BASELINE, from `git archive` into a temporary directory, removed
#     after) into bin/payments-baseline, and tools/benchplot into bin/benchplot.
#  2. Starts `payments serve` on a free loopback port (logs in bin/bench-server.log).
#  3. Runs ../shared/bench/pg-reference at the same concurrency: reference_tps.
#  4. Runs the scenarios fresh, replay, storm and mixed with bin/paymentsbench, each
#     verifying through the API that the balances match what succeeded; during the
#     storm it samples pg_stat_activity for the connections in use.
#  4b. Group commit (issue 12): the baseline ("before") and this checkout
#     ("after"), each serving its own new scratch database, both with
#     IDEMPOTENCY_WAIT=BENCH_KEY_WAIT, run alternately (before, after; then after,
#     before; BENCH_PAIRS rounds): fresh over 1,000 accounts with the service's
#     CPU time read from /proc/PID/stat; fresh on one account; the same with a
#     key held in flight by a psql session (advisory lock plus the key's row,
#     as another replica holds it) while one more client retries that key; and
#     fresh with one client; pg-reference -c BENCH_CLIENTS once per round. Then,
#     unless BENCH_CURVE=0, fresh and pg-reference at each of BENCH_CURVE_CLIENTS
#     (the service restarted with the defaults), drawn by bin/benchplot.
#  4c. CPU per charge by part, the relay on and off (issue 24): scripts/bench-pair.sh,
#     BENCH_CPU_BASELINE against this checkout, over 1,000 accounts and one.
#  5. Heap: restarts the service and sends BENCH_HEAP_KEYS distinct keys (fresh, in
#     chunks, within BENCH_HEAP_BUDGET seconds), reading the heap from /metrics
#     after the first 10,000 keys, halfway and at the end, each time once settled.
#  6. Janitor: seeds BENCH_JANITOR_KEYS expired keys, runs fresh with a TTL under
#     which they are not expired (the janitor finds nothing), then restarts with
#     the default TTL so the janitor deletes them while fresh runs again.
#  7. Large table (unless BENCH_LARGE=0): on a second scratch database, fresh on
#     an empty table, then seeds BENCH_LARGE_KEYS live keys and runs fresh twice,
#     then truncates the table and runs fresh on it empty again.
#  8. Go benchmarks: the key claim's overhead on the group-committed path
#     (BENCH_CLAIM_COUNT interleaved runs, default 5), the stored body size
#     (zstd) and the relay's commit-to-publish delay (issue 4).
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
#   BENCH_BASELINE       git ref of the service before group commit (default ac4142a);
#                        empty, or a ref this clone lacks: no "before" column (said so
#                        in the report and on stderr)
#   BENCH_PAIRS          rounds of the paired before/after runs (default 2; each
#                        round is ~2 minutes with BENCH_SECONDS=10)
#   BENCH_KEY_WAIT       IDEMPOTENCY_WAIT of both services in step 4b (default 1s), so a
#                        retry of the held key answers 409 after that instead of 5 s
#   BENCH_CURVE          1 (default): the throughput curve and its two PNGs; 0 skips it
#                        (~3 minutes with BENCH_SECONDS=10)
#   BENCH_CURVE_CLIENTS  the client counts of the curve (default "1 2 4 8 16 32 64")
#   BENCH_CPU            1 (default): step 4c, CPU per charge by part with the relay on
#                        and off (scripts/bench-pair.sh, over 1,000 accounts and one;
#                        ~4 minutes a round each); 0 skips it
#   BENCH_CPU_BASELINE   side A of step 4c (default 8685d9f, before issue 24; HEAD
#                        when this clone lacks it)
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
baseline_ref=${BENCH_BASELINE-ac4142a}
pairs=${BENCH_PAIRS:-2}
key_wait=${BENCH_KEY_WAIT:-1s}
curve=${BENCH_CURVE:-1}
curve_clients=${BENCH_CURVE_CLIENTS:-1 2 4 8 16 32 64}
admin=${PAYMENTS_BENCH_DATABASE_URL:-${PAYMENTS_TEST_DATABASE_URL:-postgres://postgres@localhost:5432/postgres?sslmode=disable}}
for v in seconds clients heap_budget janitor_keys large_keys pairs; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v (BENCH_${v^^}) must be a positive whole number, got '${!v}'"
done
[[ $heap_keys =~ ^[1-9][0-9]*$ ]] && [ "$heap_keys" -ge 20000 ] ||
	die "BENCH_HEAP_KEYS must be a whole number of at least 20000, got '$heap_keys'"
[[ $large =~ ^[01]$ ]] || die "BENCH_LARGE must be 0 or 1, got '$large'"
[[ $curve =~ ^[01]$ ]] || die "BENCH_CURVE must be 0 or 1, got '$curve'"
[[ $curve_clients =~ ^[[:space:]]*[1-9][0-9]*([[:space:]]+[1-9][0-9]*)*[[:space:]]*$ ]] ||
	die "BENCH_CURVE_CLIENTS must be positive whole numbers separated by spaces, got '$curve_clients'"
[[ $key_wait =~ ^[0-9]+(\.[0-9]+)?(ms|s)$ ]] || die "BENCH_KEY_WAIT must be a duration like 1s or 500ms, got '$key_wait'"

shared=../shared
[ -x "$shared/bench/pg-reference" ] || shared=/work/shared
[ -x "$shared/bench/pg-reference" ] ||
	die "pg-reference not found in ../shared/bench or /work/shared/bench"
for tool in "$GO" psql pgbench getconf; do
	command -v "$tool" >/dev/null 2>&1 ||
		die "$tool is not installed (psql and pgbench: Debian/Ubuntu package postgresql-client)"
done

# The scratch databases sit on the admin server; their URLs keep the admin query.
db=payments_bench_$$
db_large=payments_bench_$$_large
db_before=payments_bench_$$_before
db_after=payments_bench_$$_after
base=${admin%%\?*} query=${admin#"$base"}
[[ $query == "$admin" ]] && query=
scratch="${base%/*}/$db$query"
scratch_large="${base%/*}/$db_large$query"
mkdir -p bin "$(dirname "$report")"
# What an earlier run left would otherwise mix with this run's logs and samples.
rm -f bin/bench-server*.log bin/bench-*.err bin/bench-heap-*.txt bin/bench-janitor-*.txt bin/bench-held-*.txt
find bin -maxdepth 1 -name 'bench-go-*.txt' -delete
server_log=bin/bench-server.log
results=bin/bench-results.jsonl
storm_samples=bin/bench-storm-activity.txt
pgref_results=bin/bench-pgref.txt
curve_file=bin/bench-curve.tsv
: >"$pgref_results"
rm -f "$curve_file"

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

server_pid='' sampler_pid='' metrics_sampler_pid='' port='' url='' nats_pid='' nats_dir=''
service_bin='' holder_pid='' holder_backend='' tmp_dir=''
declare -A run_load=() side_pid=()
cleanup() {
	if [ -n "$sampler_pid" ]; then kill "$sampler_pid" 2>/dev/null || true; fi
	stop_metrics_sampler
	stop_service
	release_key
	for side in "${!side_pid[@]}"; do stop_pid "${side_pid[$side]}"; done
	for d in "$db" "$db_large" "$db_before" "$db_after"; do
		psql -qX "$admin" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
	done
	if [ -n "$tmp_dir" ]; then rm -rf "$tmp_dir"; fi
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
# fields NAME REGEX: the field NAME of every run whose name matches ^REGEX$, one a
# line; nothing (and success) when there is none.
fields() { { grep -E "\"scenario\":\"$2\"" "$results" || true; } | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
# stop_pid PID: SIGTERM a service we started, then wait for its drain.
stop_pid() {
	if [ -n "$1" ]; then
		kill -TERM "$1" 2>/dev/null || true
		wait "$1" 2>/dev/null || true
	fi
}

# --- 1. Scratch database, binaries, schema, merchant -------------------------------
say "scratch database $db"
psql -qX "$admin" -c "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null ||
	die "cannot create a database with $admin;" \
		"set PAYMENTS_BENCH_DATABASE_URL to a PostgreSQL where this user may CREATE DATABASE"
say "building bin/payments and bin/paymentsbench"
"$GO" build -o bin/payments ./cmd/payments
"$GO" build -o bin/paymentsbench ./cmd/paymentsbench
tmp_dir=$(mktemp -d)

# The service before group commit, for the "before" column of issue 12.
baseline_bin='' baseline_note='' baseline_commit='' baseline_subject=''
if [ -z "$baseline_ref" ]; then
	baseline_note="BENCH_BASELINE is empty"
elif ! baseline_commit=$(git rev-parse --verify -q "$baseline_ref^{commit}" 2>/dev/null); then
	baseline_note="the git ref '$baseline_ref' (BENCH_BASELINE) is not in this clone (a shallow clone lacks it: git fetch --unshallow)"
else
	baseline_subject=$(git log -1 --format=%s "$baseline_commit")
	say "building the baseline $baseline_ref (${baseline_commit:0:12}) into bin/payments-baseline"
	mkdir "$tmp_dir/baseline"
	if git archive "$baseline_commit" | tar -x -C "$tmp_dir/baseline" &&
		(cd "$tmp_dir/baseline" && "$GO" build -buildvcs=false -o "$OLDPWD/bin/payments-baseline" ./cmd/payments) \
			>bin/bench-baseline-build.log 2>&1; then
		baseline_bin=bin/payments-baseline
	else
		baseline_note="building $baseline_ref failed: $(head -n 3 bin/bench-baseline-build.log | tr '\n' ' ')"
	fi
	rm -rf "$tmp_dir/baseline"
fi
[ -n "$baseline_bin" ] || say "WARNING: no baseline, so no \"before\" column in issue 12: $baseline_note"

# The curve's charts, drawn by a module of its own (gonum/plot stays out of go.mod).
plot_bin='' plot_note=''
if [ "$curve" = 1 ]; then
	say "testing and building tools/benchplot into bin/benchplot"
	if (cd tools/benchplot && "$GO" vet ./... && "$GO" test -count=1 ./... && "$GO" build -o ../../bin/benchplot .) \
		>bin/bench-benchplot-build.log 2>&1; then
		plot_bin=bin/benchplot
	else
		plot_note="tools/benchplot failed its checks or did not build: $(grep -v '^ok' bin/bench-benchplot-build.log | head -n 3 | tr '\n' ' ')"
		say "WARNING: $plot_note; the curve is measured but not drawn"
	fi
fi

# pg-reference with pgbench logging each transaction's latency, for the
# percentiles pg-reference does not print: a pgbench on PATH that adds -l.
make_pgbench_shim "$tmp_dir/shim"

# The services' relays publish to a NATS of this run's own, on a random port,
# so benchmarks do not fill the machine's shared one; it goes with the run.
start_nats

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
# while another holds it waits on the key's advisory lock (group commit) or on
# its entry in idempotency_keys, so the connections used for one key are those
# waiters plus the holder. Each sample is
# "unix_ms busy_connections key_lock_waiters"; only those in the measured run count.
start_sampler() {
	printf '%s\n' "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint," \
		"count(*) FILTER (WHERE state <> 'idle')," \
		"count(*) FILTER (WHERE wait_event_type = 'Lock' AND (wait_event = 'advisory' OR query LIKE '%idempotency_keys%'))" \
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

# --- 4b. Group commit (issue 12): before and after, paired ---------------------------
# Both services run side by side, each on a new scratch database of its own,
# with the same settings; the runs alternate between them so drift on a shared
# machine falls on both. Runs are named i12-SIDE-KIND-rROUND.
say "group commit (issue 12): before (${baseline_bin:-none}) and after (bin/payments), IDEMPOTENCY_WAIT=$key_wait, $pairs round(s)"
step_began=$SECONDS
i12_load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
clk_tck=$(getconf CLK_TCK)
sides=(after)
[ -z "$baseline_bin" ] || sides=(before after)
declare -A side_bin=([before]=$baseline_bin [after]=bin/payments) side_db=() side_key=() side_merchant=() side_url=()
side_db_name() { if [ "$1" = before ]; then echo "$db_before"; else echo "$db_after"; fi; }
# new_merchant sets api_key and merchant_id; the later steps need the first ones back.
main_api_key=$api_key main_merchant_id=$merchant_id
for side in "${sides[@]}"; do
	name=$(side_db_name "$side")
	psql -qX "$admin" -c "CREATE DATABASE $name TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null ||
		die "cannot create $name"
	side_db[$side]="${base%/*}/$name$query"
	new_merchant "${side_db[$side]}" "${side_bin[$side]}"
	side_key[$side]=$api_key side_merchant[$side]=$merchant_id
	service_bin=${side_bin[$side]}
	start_service "${side_db[$side]}" "bin/bench-server-$side.log" IDEMPOTENCY_WAIT="$key_wait"
	service_bin=''
	side_pid[$side]=$server_pid side_url[$side]=$url
	server_pid=''
	say "  $side: ${side_bin[$side]} at $url on $name (log: bin/bench-server-$side.log)"
done
api_key=$main_api_key merchant_id=$main_merchant_id
# i12_run SIDE TAG CLIENTS [paymentsbench flags]: one fresh run of
# BENCH_SECONDS against the SIDE service (run_fresh, with its url and CLIENTS).
i12_run() {
	local side=$1 tag=$2 c=$3
	shift 3
	url=${side_url[$side]} clients=$c run_fresh "$tag" "${side_key[$side]}" -d "${seconds}s" "$@" ||
		i12_lost+=("$tag")
}
i12_lost=()
# One account takes every charge of a run: room for 20,000 charges/s of 100.
one_balance=$((seconds * 20000 * 100))
[ "$one_balance" -ge 99999999 ] || one_balance=99999999
for r in $(seq "$pairs"); do
	order=("${sides[@]}")
	if [ ${#sides[@]} -eq 2 ] && [ $((r % 2)) -eq 0 ]; then order=(after before); fi
	say "  round $r of $pairs (${order[*]})"
	for side in "${order[@]}"; do
		i12_run "$side" "i12-$side-fresh-r$r" "$clients" -service-pid "${side_pid[$side]}"
	done
	pgref "$clients" "i12-ref-r$r" || true
	for side in "${order[@]}"; do
		i12_run "$side" "i12-$side-one-r$r" "$clients" -accounts 1 -balance "$one_balance"
		held="bench-held-$$-$side-r$r"
		if hold_key "${side_db[$side]}" "${side_merchant[$side]}" "$held" "bin/bench-held-$side-r$r.txt"; then
			i12_run "$side" "i12-$side-held-r$r" "$clients" -accounts 1 -balance "$one_balance" -held-key "$held"
			release_key
		else
			i12_lost+=("i12-$side-held-r$r")
		fi
	done
	for side in "${order[@]}"; do
		i12_run "$side" "i12-$side-single-r$r" 1
	done
done
for side in "${sides[@]}"; do stop_pid "${side_pid[$side]}"; done
side_pid=()

# The curve: the service (restarted with the defaults) and pg-reference at each
# client count, one after the other.
curve_note=''
if [ "$curve" = 1 ]; then
	say "  curve: fresh and pg-reference at $curve_clients clients"
	start_service "${side_db[after]}" bin/bench-server-curve.log
	printf '# series clients charges_per_s p99_ms (bench.sh, %s s per point)\n' "$seconds" >"$curve_file"
	for n in $curve_clients; do
		if clients=$n run_fresh "curve-c$n" "${side_key[after]}" -d "${seconds}s"; then
			echo "payments $n $(field charges_per_s "curve-c$n") $(field p99_ms "curve-c$n")" >>"$curve_file"
		else
			i12_lost+=("curve-c$n")
		fi
		if pgref "$n" "curve-ref-c$n"; then
			echo "pg-reference $n $(pgref_field "curve-ref-c$n" 3) $(pgref_field "curve-ref-c$n" 6)" >>"$curve_file"
		fi
	done
	stop_service
	if [ -n "$plot_bin" ]; then
		plot_dir=$(dirname "$report")
		if "$plot_bin" -in "$curve_file" -throughput "$plot_dir/bench-throughput.png" -p99 "$plot_dir/bench-p99.png" \
			-title "$(nproc) CPUs, $(date -u '+%Y-%m-%d'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), ${seconds} s per point" \
			2>bin/bench-benchplot.err; then
			say "  drew $plot_dir/bench-throughput.png and $plot_dir/bench-p99.png"
		else
			curve_note="bin/benchplot failed: $(head -n 3 bin/bench-benchplot.err | tr '\n' ' ')"
			say "WARNING: $curve_note"
		fi
	else
		curve_note=$plot_note
	fi
else
	curve_note="skipped in this run (BENCH_CURVE=0)"
fi
for d in "$db_before" "$db_after"; do
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
done
i12_load_after=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
i12_step_s=$((SECONDS - step_began))

# --- 4c. CPU per charge by part, the relay on and off (issue 24) --------------------
# scripts/bench-pair.sh: BENCH_CPU_BASELINE against this checkout, each with the
# relay on (as shipped) and off, alternating, pg-reference each round, over
# 1,000 accounts and on one; CPU per charge of the machine, the service,
# PostgreSQL, nats-server and the load generator from /proc. Its tables go
# into the report as they are printed.
cpu_section='' cpu_step_s=0
if [ "${BENCH_CPU:-1}" != 0 ]; then
	step_began=$SECONDS
	cpu_baseline=${BENCH_CPU_BASELINE-8685d9f}
	git cat-file -e "${cpu_baseline:-HEAD}^{commit}" 2>/dev/null || cpu_baseline=HEAD
	# pass: accounts, relay states, PAIR_EVENTS, what the table is.
	for pass in "1000|on off||Over 1,000 accounts" "1|on off||On one account" \
		"1000|on|1|Commit-to-publish under the same load: the relay on, a NATS subscriber timing each charge's event from its transaction's start (its CPU adds to nats-server's and the load generator's)"; do
		IFS='|' read -r accts relays events title <<<"$pass"
		say "CPU by part (issue 24): $cpu_baseline vs this checkout, relay $relays, $accts account(s)${events:+, event delays}, $pairs round(s)"
		log=bin/bench-pair-$accts${events:+-events}.log
		if table=$(PAYMENTS_TEST_DATABASE_URL=$admin PAIR_A=$cpu_baseline PAIR_B='' PAIR_ROUNDS=$pairs PAIR_SECONDS=$seconds \
			PAIR_CLIENTS=$clients PAIR_ACCOUNTS=$accts PAIR_RELAY=$relays PAIR_EVENTS=$events scripts/bench-pair.sh 2>"$log" | sed '/./,$!d'); then
			cpu_section+=$(printf '\n\n%s:\n\n%s' "$title" "$table")
		else
			cpu_section+=$(printf '\n\n%s: bench-pair failed: %s' "$title" "$(tail -n 3 "$log" | tr '\n' ' ')")
		fi
	done
	cpu_step_s=$((SECONDS - step_began))
fi

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

# The key's price on the group-committed path: BenchmarkKeyClaimOverhead runs
# the same batches with and without the key (locks, lookup, key rows), 16
# goroutines over 1,000 accounts, interleaved BENCH_CLAIM_COUNT times; the
# overhead is the ratio of the medians, minus one.
claim_count=${BENCH_CLAIM_COUNT:-5}
say "go benchmark KeyClaimOverhead ($claim_count runs, each with then without the key)"
claim_ok=1
for i in $(seq "$claim_count"); do
	go_bench KeyClaimOverhead ./internal/postgres/ -benchtime 20000x || { claim_ok=0; break; }
	cat bin/bench-go-KeyClaimOverhead.txt >>bin/bench-go-KeyClaimOverhead-all.txt
done
[ "$claim_ok" = 0 ] || mv bin/bench-go-KeyClaimOverhead-all.txt bin/bench-go-KeyClaimOverhead.txt
if [ "$claim_ok" = 1 ]; then
	f=bin/bench-go-KeyClaimOverhead.txt
	with=$(awk '/^BenchmarkKeyClaimOverhead\/with-key/ { print $3 }' "$f" | sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
	without=$(awk '/^BenchmarkKeyClaimOverhead\/without-key/ { print $3 }' "$f" | sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
	if [ -n "$with" ] && [ -n "$without" ]; then
		claim_pct=$(awk -v w="$with" -v o="$without" 'BEGIN { printf "%.1f", 100 * (w / o - 1) }')
		claim_result=$(verdict_le "$claim_pct" 10)
		claim_figure="$claim_pct % (median of $claim_count interleaved runs: $(awk -v n="$with" 'BEGIN { printf "%.0f", n / 1000 }') µs a charge with the key, $(awk -v n="$without" 'BEGIN { printf "%.0f", n / 1000 }') µs without; all runs in bin/bench-go-KeyClaimOverhead.txt)"
	else
		claim_result='not measured' claim_figure="go test printed no with-key/without-key lines (bin/bench-go-KeyClaimOverhead.txt)"
	fi
else
	claim_result='not measured' claim_figure="go test failed: $(go_failure bin/bench-go-KeyClaimOverhead.txt)"
fi
say "  key claim overhead: $claim_result"

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
	storm_figure="at most $((storm_locks_max + 1)) connection(s) seen for one key: the one holding it, plus $storm_locks_max waiting on its lock (its advisory lock, or its entry in idempotency_keys) ($storm_busy_max busy in all, mean $storm_busy_mean); pg_stat_activity sampled every 0.1 s ($storm_n samples), so a short burst can slip between samples"
fi
warnings=$(log_warnings bin/bench-server*.log)

# Issue 12's figures: each the mean over the rounds of one side's runs.
# i12_mean FIELD SIDE KIND [DIGITS]
i12_mean() { fields "$1" "i12-$2-$3-r[0-9]+" | mean "${4:-1}"; }
# held_answers SIDE: the held-key client's answers over the rounds, e.g. "409: 18".
held_answers() {
	{ grep -E "\"scenario\":\"i12-$1-held-r[0-9]+\"" "$results" || true; } |
		sed -n 's/.*"held_key_statuses":{\([^}]*\)}.*/\1/p' | tr ',' '\n' | tr -d '"' |
		awk -F: 'NF == 2 { n[$1] += $2 } END { for (k in n) printf "%s%s: %d", (s++ ? ", " : ""), k, n[k] }'
}
declare -A cps_fresh=() cps_one=() p50_single=() p99_one=() p99_held=() cpu_ms=() held_ratio=() i12_n=()
for side in before after; do
	i12_n[$side]=$(fields charges "i12-$side-fresh-r[0-9]+" | wc -l)
	cps_fresh[$side]=$(i12_mean charges_per_s "$side" fresh)
	cps_one[$side]=$(i12_mean charges_per_s "$side" one)
	p50_single[$side]=$(i12_mean p50_ms "$side" single 3)
	p99_one[$side]=$(i12_mean p99_ms "$side" one 3)
	p99_held[$side]=$(i12_mean p99_ms "$side" held 3)
	held_ratio[$side]=$([ -n "${p99_held[$side]}" ] && ratio "${p99_held[$side]}" "${p99_one[$side]}" || true)
	cpu_ms[$side]=$(paste <(fields service_cpu_ticks "i12-$side-fresh-r[0-9]+") <(fields charges "i12-$side-fresh-r[0-9]+") |
		awk -v hz="$clk_tck" 'NF == 2 { t += $1; n += $2 } END { if (n > 0) printf "%.3f", t * 1000 / hz / n }')
done
ref_tps=$(awk '$1 ~ /^i12-ref-r[0-9]+$/ && $3 != "" { print $3 }' "$pgref_results" | mean 1)
ref_p50_1=$(pgref_field curve-ref-c1 5)
# or_dash VALUE [MORE]: "VALUE MORE", or an em dash when VALUE is empty.
or_dash() { if [ -n "$1" ]; then echo "$1${2:+ $2}"; else echo "—"; fi; }
# with_ratio VALUE OF [SUFFIX]: "VALUE SUFFIX (VALUE/OF ×)", or a dash.
with_ratio() {
	if [ -z "$1" ]; then echo "—"; elif [ -z "$2" ]; then echo "$1${3:+ $3}"; else echo "$1${3:+ $3} ($(ratio "$1" "$2") ×)"; fi
}
no_before="not measured: no baseline ($baseline_note)"
if [ -n "$baseline_bin" ]; then
	single_ratio=$(ratio "${p50_single[after]}" "${p50_single[before]}")
	cpu_ratio=$(ratio "${cpu_ms[after]}" "${cpu_ms[before]}")
	single_result=$([ -n "${p50_single[after]}" ] && [ -n "${p50_single[before]}" ] && verdict_le "$single_ratio" 1.2 || echo "not measured")
	cpu_result=$([ -n "${cpu_ms[after]}" ] && [ -n "${cpu_ms[before]}" ] && verdict_le "$cpu_ratio" 0.5 || echo "not measured")
	fresh_vs=" after ÷ before $(ratio "${cps_fresh[after]}" "${cps_fresh[before]}") ×"
	one_vs=" after ÷ before $(ratio "${cps_one[after]}" "${cps_one[before]}") ×"
else
	single_ratio='' cpu_ratio='' single_result=$no_before cpu_result=$no_before fresh_vs='' one_vs=''
fi
held_result=$([ -n "${held_ratio[after]}" ] && verdict_le "${held_ratio[after]}" 1.5 || echo "not measured")
# held_cell SIDE: "p99 X ms with the key held, Y ms without (Z ×)".
held_cell() {
	if [ -z "${p99_held[$1]}" ]; then
		echo "—"
	else
		echo "${p99_held[$1]} ms held vs ${p99_one[$1]} ms not (${held_ratio[$1]} ×); the retrying client: $(or_dash "$(held_answers "$1")")"
	fi
}

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
[ "$baseline_ref" = ac4142a ] || repro+=" BENCH_BASELINE=$baseline_ref"
[ "$pairs" = 2 ] || repro+=" BENCH_PAIRS=$pairs"
[ "$key_wait" = 1s ] || repro+=" BENCH_KEY_WAIT=$key_wait"
[ "$curve" = 1 ] || repro+=" BENCH_CURVE=$curve"
[ "$curve_clients" = "1 2 4 8 16 32 64" ] || repro+=" BENCH_CURVE_CLIENTS='$curve_clients'"

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
# The section make bench-sync writes (scripts/bench-sync.sh) is measured by a
# run of its own, on the HA cluster: carried over as it is, at the end.
sync_section=$(sed -n '/^<!-- bench-sync:begin -->$/,/^<!-- bench-sync:end -->$/p' "$report" 2>/dev/null || true)
# Sections measured by hand for one issue (each names its command) sit between
# <!-- kept:begin --> and <!-- kept:end -->: carried over as they are.
kept_sections=$(sed -n '/^<!-- kept:begin -->$/,/^<!-- kept:end -->$/p' "$report" 2>/dev/null || true)
{
	cat <<EOF
# Benchmarks

Generated by \`make bench\` (\`scripts/bench.sh\`); do not edit by hand. Issue 5 sets
the targets of the first part, issue 12 those of group commit
([below](#group-commit-issue-12)). The service, PostgreSQL, the load generator and pgbench all ran on
the machine below in the same run, so the ratios matter more than the absolute
figures, which drift from run to run on a small shared machine.
[The cost of synchronous replication](#the-cost-of-synchronous-replication-issue-15)
is measured apart, by \`make bench-sync\` (\`scripts/bench-sync.sh\`), which
rewrites only that section; \`make bench\` keeps it as it is.

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
| key-claim overhead ≤ 10 % (\`go test -run '^\$' -bench KeyClaimOverhead -benchtime 20000x ./internal/postgres/\`, $claim_count times) | $claim_result | $claim_figure |
| storm of $clients clients on one key: one pooled connection for that key | $storm_result | $storm_figure |
| janitor deleting $janitor_keys expired keys: fresh p99 ≤ 2 × p99 without it | $janitor_result | $janitor_figure |
| fresh p50 with $large_keys keys ≤ 1.3 × empty table | $large_result | $large_figure |
| heap after $heap_keys distinct keys settles under a stated bound ($heap_bound_mib MiB in use) | $heap_result | $heap_figure |
| stored bodies over 1 KiB compressed (zstd) where it saves space | $body_result | $body_figure |

### Why a target is missed

When **fresh charges/s** falls short of 0.6 × the reference: pg-reference is one
SQL statement sent by pgbench, a C client, straight to PostgreSQL. A charge
through the service is gathered with the charges arriving with it into one
transaction (group commit: two round trips and one commit per batch), and
around it come HTTP, authentication, strict JSON decoding and
canonicalisation, rendering and an access-log line, in a Go process that
shares the machine's $(nproc) cores with PostgreSQL and with the Go load generator.
The service's own CPU per charge, measured in this run: $(or_dash "${cpu_ms[after]}" ms) (see
[group commit](#group-commit-issue-12)). What is left to take: fewer indexes
(ordering charges and events by their UUIDv7 keys instead of separate
sequences), no charges → accounts foreign key, a cheaper access log.

The **key-claim overhead** row prices the key on the group-committed path:
the same batches with the key's lock, lookup and row taken out of their
statements (\`postgres.Store.WithoutKeys\`, test-only) against the real ones.

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

**Key-claim overhead.** BenchmarkKeyClaimOverhead: 16 goroutines charge 1,000
accounts through the charge path (\`charging.Path.CreateCharge\`), with and without the key,
interleaved $claim_count times; the overhead is the ratio of the medians.

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

EOF
	# --- Group commit (issue 12) ---
	if [ -n "$baseline_bin" ]; then
		before_desc="**before**: \`payments serve\` built from BENCH_BASELINE=$baseline_ref (${baseline_commit:0:12}, \"$baseline_subject\"): a fresh charge is one SQL statement, no group commit"
	else
		before_desc="**before**: not measured in this run: $baseline_note. Every before figure below is a dash and every target that compares with it is not judged"
	fi
	cat <<EOF
## Group commit (issue 12)

$before_desc; **after**: this checkout ($commit), which gathers concurrent charges
into one transaction. Each served a new scratch database of its own, both
running throughout, with the same settings: the defaults, except
IDEMPOTENCY_WAIT=$key_wait (so a retry of a held key answers 409 after $key_wait, not 5 s).
Their runs alternated (round 1 before then after, round 2 after then before,
…; $pairs round(s)); each figure is the mean of the ${i12_n[after]:-0} run(s) of its side,
pg-reference's the mean of its ${pairs} run(s) at $clients clients, one per round between
them. $clients clients unless said, ${seconds} s per run, balances verified after
every run. Machine load (1, 5, 15 min) $i12_load_before when this part began,
$i12_load_after when it ended; it took ${i12_step_s} s.

| target | before (baseline) | after | pg-reference | verdict |
|---|---|---|---|---|
| fresh charges/s, $clients clients over 1,000 accounts (× pg-reference) | $(with_ratio "${cps_fresh[before]}" "$ref_tps") | $(with_ratio "${cps_fresh[after]}" "$ref_tps") | $(or_dash "$ref_tps") | no target here${fresh_vs:+ (}${fresh_vs# }${fresh_vs:+)}; issue 5's 0.6 × is above |
| fresh charges/s, $clients clients all on ONE account (× pg-reference) | $(with_ratio "${cps_one[before]}" "$ref_tps") | $(with_ratio "${cps_one[after]}" "$ref_tps") | $(or_dash "$ref_tps") (over 1,000 accounts: it has no one-account mode) | no target${one_vs:+ (}${one_vs# }${one_vs:+)} |
| one client, fresh p50: after ≤ 1.2 × before | $(or_dash "${p50_single[before]}" ms) | $(with_ratio "${p50_single[after]}" "${p50_single[before]}" ms) | $(or_dash "$ref_p50_1" "ms (p50 at -c 1, from the curve)") | $single_result |
| service CPU per fresh charge ($clients clients, 1,000 accounts): after ≤ 0.5 × before | $(or_dash "${cpu_ms[before]}" ms) | $(with_ratio "${cpu_ms[after]}" "${cpu_ms[before]}" ms) | — | $cpu_result |
| a key held in flight on "another replica" while $clients clients charge its account with fresh keys: their p99 ≤ 1.5 × without | $(held_cell before) | $(held_cell after) | — | $held_result |

How each is measured:

- **Fresh charges/s**: \`paymentsbench -scenarios fresh\`, each request a new key,
  charges of 100 at random over 1,000 new accounts ("ONE account": \`-accounts 1
  -balance $one_balance\`, so every charge of a run contends for one row and the balance
  always suffices). pg-reference: \`$shared/bench/pg-reference -c $clients -T $seconds\`.
- **One client**: the same with \`-c 1\`; p50 of the request latency the client sees.
- **Service CPU**: \`paymentsbench -service-pid PID\` reads utime + stime of the
  service process from /proc/PID/stat when the clock starts and when the last
  request of the fresh $clients-client run has its answer; the difference in ticks ×
  1000 / CLK_TCK ($clk_tck) is divided by the charges completed in that window (all
  rounds summed). It is the whole process: HTTP, JSON, logging, the batches, and
  the relay publishing each charge's event to NATS.
- **Held key**: before the run a psql session on that service's database runs
  \`BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('<merchant>'::uuid::text || '<key>', 0));
  INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES (…)\` and stays
  in that transaction (pg_sleep) until the run ends, as a replica holding the key
  in flight would; \`-held-key\` adds one client that keeps retrying a charge with
  that key on the run's one account (20 ms between attempts; each answers 409
  after IDEMPOTENCY_WAIT=$key_wait), its answers counted apart from the
  $clients clients' fresh charges on the same account whose p99 is compared with the
  one-account run just before it ("not").

EOF
	# Notes on what was missed, from this run's figures.
	if [ "$single_result" = "**not met**" ]; then
		cat <<EOF
**One client, p50 ${single_ratio} × before (target ≤ 1.2 ×).** With one client there is no
company to batch with: every charge is a batch of one, which takes two round
trips to PostgreSQL (BEGIN with the key's advisory lock, the key lookup and the
account lock; then the writes and COMMIT) where the baseline's fast path sent
one statement in autocommit. Group commit pays for its gains at concurrency
with that second round trip when alone.

EOF
	fi
	if [ "$cpu_result" = "**not met**" ]; then
		cat <<EOF
**Service CPU per charge ${cpu_ratio} × before (target ≤ 0.5 ×).** The figure is the whole
process, of which the database round trips that batching saves are only a
part: the HTTP, authentication, JSON, rendering, access log and relay work per
charge stay the same, batched or not. The ticks are 1/$clk_tck s each, read
around the run, and on a shared machine CPU time per unit of work also grows
with contention.

EOF
	fi
	if [ "$held_result" = "**not met**" ]; then
		cat <<EOF
**Held key, p99 ${held_ratio[after]} × without (target ≤ 1.5 ×).** The design says a retry of a
held key leaves its batch and waits for the key's advisory lock alone,
holding no account, so the fresh charges on that account should not wait for
it; this run says otherwise or is noisy (compare the held and one-account runs
of each round below, and bin/bench-server-after.log).

EOF
	fi
	if [ -n "${held_ratio[before]}" ] && [ "$(verdict_le "${held_ratio[before]}" 1.5)" = "**not met**" ]; then
		held_before_errors=$(fields error_count "i12-before-held-r[0-9]+" | awk '{ s += $1 } END { print s + 0 }')
		cat <<EOF
The baseline misses the held-key bound (${held_ratio[before]} ×) as its design predicts: its
one statement debits the account before it claims the key, so every retry of
the held key holds the account's row lock for up to IDEMPOTENCY_WAIT while it
waits on the key's index entry, and every fresh charge on that account queues
behind it.$([ "$held_before_errors" -eq 0 ] || echo " $held_before_errors of its fresh charges in those runs were answered with an error (the errors column of the i12-before-held runs below): with IDEMPOTENCY_WAIT=$key_wait they waited out that bound behind the lock.")

EOF
	fi
	if [ ${#i12_lost[@]} -gt 0 ]; then
		printf '**Runs that gave no result** (see bin/bench-*.err and bench.sh'"'"'s output): %s.\n\n' "${i12_lost[*]}"
	fi
	cat <<EOF
### Throughput curve

EOF
	if [ "$curve" = 1 ] && [ -z "$curve_note" ]; then
		cat <<EOF
![Fresh charges/s against concurrent clients, the service and pg-reference](bench-throughput.png)

![p99 latency of fresh charges against concurrent clients, the service and pg-reference](bench-p99.png)

EOF
	elif [ "$curve" = 1 ]; then
		printf 'Measured but not drawn: %s. The figures:\n\n' "$curve_note"
	else
		printf 'Not measured: %s.\n\n' "$curve_note"
	fi
	if [ "$curve" = 1 ]; then
		cat <<EOF
Fresh charges over 1,000 accounts, ${seconds} s per point, by the service restarted
with the defaults (IDEMPOTENCY_WAIT 5 s) on the "after" database, and by
pg-reference at the same concurrency right after it. pg-reference prints only
its tps and mean latency; for its percentiles bench.sh runs it with a
\`pgbench\` first on PATH that adds \`-l\` (a line per transaction) and takes
the nearest-rank p50 and p99 of those. Drawn by \`tools/benchplot\` from
\`bin/bench-curve.tsv\`.

| clients | service charges/s | service p50 ms | service p99 ms | pg-reference tps | pg-reference p50 ms | pg-reference p99 ms | service ÷ pg-reference |
|---:|---:|---:|---:|---:|---:|---:|---:|
EOF
		for n in $curve_clients; do
			printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" \
				"$(or_dash "$(field charges_per_s "curve-c$n")")" "$(or_dash "$(field p50_ms "curve-c$n")")" \
				"$(or_dash "$(field p99_ms "curve-c$n")")" "$(or_dash "$(pgref_field "curve-ref-c$n" 3)")" \
				"$(or_dash "$(pgref_field "curve-ref-c$n" 5)")" "$(or_dash "$(pgref_field "curve-ref-c$n" 6)")" \
				"$(ratio "$(field charges_per_s "curve-c$n")" "$(pgref_field "curve-ref-c$n" 3)")"
		done
		echo
	fi
	cat <<EOF
### The runs

Every run of this part, in the order they ran, with the columns of the first
table and the 1-minute load average when each ended:

$(sed '1s/$/ load |/; 2s/$/---:|/' <<<"$table_head")
EOF
	while read -r r; do row "$r" "${run_load[$r]:-?}"; done < <(sed -n 's/.*"scenario":"\(i12-[^"]*\|curve-[^"]*\)".*/\1/p' "$results")
	cat <<EOF

pg-reference's runs (tps as it prints it; p50 and p99 from pgbench's per-transaction log):

| run | clients | tps | avg ms | p50 ms | p99 ms |
|---|---:|---:|---:|---:|---:|
$(awk '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }' "$pgref_results")

### Reproduce

    $repro make bench

This part by hand (\`make bench\` does all of it on scratch databases and
cleans up):

    git archive ${baseline_ref:-ac4142a} | tar -x -C /tmp/baseline    # into an empty directory
    (cd /tmp/baseline && go build -o "\$OLDPWD/bin/payments-baseline" ./cmd/payments)
    # each binary on a database of its own: migrate up, merchants create, then
    IDEMPOTENCY_WAIT=$key_wait HTTP_ADDR=127.0.0.1:8081 bin/payments-baseline serve
    IDEMPOTENCY_WAIT=$key_wait HTTP_ADDR=127.0.0.1:8082 bin/payments serve
    # against each (its merchant's PAYMENTS_API_KEY, its process id), alternating:
    bin/paymentsbench -url URL -c $clients -d ${seconds}s -scenarios fresh -json -service-pid PID
    bin/paymentsbench -url URL -c $clients -d ${seconds}s -scenarios fresh -json -accounts 1 -balance $one_balance
    #   in psql on that database, left open during the next run:
    #   BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('MERCHANT'::uuid::text || 'KEY', 0));
    #   INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ('MERCHANT', 'KEY', '\\x00');
    bin/paymentsbench -url URL -c $clients -d ${seconds}s -scenarios fresh -json -accounts 1 -balance $one_balance -held-key KEY
    bin/paymentsbench -url URL -c 1 -d ${seconds}s -scenarios fresh -json
    $shared/bench/pg-reference -c $clients -T $seconds
    # the curve, for N in $curve_clients (the service with its defaults):
    bin/paymentsbench -url URL -c N -d ${seconds}s -scenarios fresh -json
    $shared/bench/pg-reference -c N -T $seconds
    (cd tools/benchplot && go run . -in ../../bin/bench-curve.tsv -throughput ../../docs/bench-throughput.png -p99 ../../docs/bench-p99.png)

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
| service | \`payments serve\`, defaults (DB_MAX_CONNS 20, IDEMPOTENCY_CACHE_SIZE 10000, LOG_LEVEL ${BENCH_LOG_LEVEL:-info}, logs to files bin/bench-server*.log; its relay publishes to a NATS server of the run's own, \`nats-server -js\` on a random loopback port), except IDEMPOTENCY_TTL in janitor-off and IDEMPOTENCY_WAIT=$key_wait in the paired runs of issue 12 (the baseline there too) |
| service warnings | ${warnings:-none} (WARN and ERROR lines in the service logs, "NATS disconnected" at shutdown aside) |
| run time | $elapsed s for the whole \`$repro make bench\` (group commit $i12_step_s s, heap $heap_step_s s, janitor $janitor_step_s s${large_step_s:+, large table $large_step_s s}) |

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
	if [ -n "$cpu_section" ]; then
		printf '\n## CPU per charge by part, the relay on and off (issue 24)\n\n'
		printf 'Side A is %s, side B this checkout (%s); each with the relay on (publishing to NATS, as shipped) and off, alternating, a new database and a CHECKPOINT before each measurement, pg-reference each round; medians of %s rounds, %s clients, %s s each, CPU per charge from /proc (%s s for this step):\n\n    PAIR_A=%s PAIR_ROUNDS=%s PAIR_SECONDS=%s PAIR_CLIENTS=%s make bench-pair    # PAIR_ACCOUNTS=1: one account\n' \
			"$cpu_baseline" "$(git rev-parse --short HEAD)" "$pairs" "$clients" "$seconds" "$cpu_step_s" "$cpu_baseline" "$pairs" "$seconds" "$clients"
		printf '%s\n' "${cpu_section#$'\n'}"
	fi
	if [ -n "$kept_sections" ]; then printf '\n%s\n' "$kept_sections"; fi
	if [ -n "$sync_section" ]; then printf '\n%s\n' "$sync_section"; fi
} >"$report"

say "wrote $report in ${elapsed}s: fresh/reference $fresh_ratio, replay/fresh $replay_ratio"
sed -n '/^| target/,/^$/p' "$report" >&2
[ ${#failed[@]} -eq 0 ] || die "balances did not match in: ${failed[*]} (see $report and $results)"
