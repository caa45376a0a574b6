#!/usr/bin/env bash
# bench-sync.sh: the cost of synchronous replication (issue 15): fresh charges
# with a synchronous standby against a single server, written into the section
# "The cost of synchronous replication" of docs/benchmarks.md (`make
# bench-sync` calls it; `make bench` keeps that section as it is).
#
# Three configurations, the same binaries and the same load:
#   A  the service on the HA cluster (`make ha-up`, which this starts if it is
#      not running and leaves running), through its multi-host DATABASE_URL:
#      every commit waits for the synchronous standby;
#   B  the same cluster and database with
#      `ALTER DATABASE <db> SET synchronous_commit = local` (reset after each
#      run): commits do not wait for the standby, which still streams;
#   C  the single local PostgreSQL (PAYMENTS_BENCH_DATABASE_URL, default
#      127.0.0.1:5432), as the README's default setup.
# Each gets a scratch database (syncbench_<pid>, created from template0 with
# the C locale, as make bench does; dropped on exit). In every round each
# configuration, in turn, gets a CHECKPOINT on its server, a fresh service,
# bin/paymentsbench's fresh scenario at each client count, then
# ../shared/bench/pg-reference on the same server at the same client counts
# (for B with PGOPTIONS='-c synchronous_commit=local'). The order alternates,
# A B C, then C B A, so drift on a shared machine falls on all three. The
# report gives each figure's median over the rounds, and medians of the
# ratios taken within a round.
#
# Environment:
#   BENCH_SECONDS        seconds per run, service and pg-reference (default 10)
#   BENCH_SYNC_ROUNDS    rounds (default 6)
#   BENCH_SYNC_CLIENTS   client counts (default "16 1")
#   BENCH_REPORT         the file whose section is rewritten (default docs/benchmarks.md)
#   PAYMENTS_BENCH_DATABASE_URL: the single server, where this may CREATE DATABASE
#     (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'bench-sync: %s\n' "$*" >&2; }
die() {
	printf 'bench-sync: %s\n' "$@" >&2
	exit 1
}

began=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
GO=${GO:-go}
seconds=${BENCH_SECONDS:-10}
rounds=${BENCH_SYNC_ROUNDS:-6}
client_counts=${BENCH_SYNC_CLIENTS:-16 1}
report=${BENCH_REPORT:-docs/benchmarks.md}
local_admin=${PAYMENTS_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
for v in seconds rounds; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive whole number, got '${!v}'"
done
[[ $client_counts =~ ^[[:space:]]*[1-9][0-9]*([[:space:]]+[1-9][0-9]*)*[[:space:]]*$ ]] ||
	die "BENCH_SYNC_CLIENTS must be positive whole numbers separated by spaces, got '$client_counts'"
shared=../shared
[ -x "$shared/bench/pg-reference" ] || shared=/work/shared
[ -x "$shared/bench/pg-reference" ] || die "pg-reference not found in ../shared/bench or /work/shared/bench"
for tool in "$GO" psql pgbench; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (psql and pgbench: package postgresql-client)"
done

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

db=syncbench_$$
mkdir -p bin
results=bin/bench-sync-results.jsonl pgref_results=bin/bench-sync-pgref.txt
: >"$results"
: >"$pgref_results"
rm -f bin/bench-sync-server-*.log bin/bench-*.err
server_pid='' metrics_sampler_pid='' port='' url='' nats_pid='' nats_dir='' service_bin=''
tmp_dir=$(mktemp -d)
primary_admin='' local_created=0 ha_created=0
declare -A sampler_pid=()
declare -A run_load=()
failed=() lost=()

# psql_at URL SQL: one value, unaligned.
psql_at() { psql -qXAt -v ON_ERROR_STOP=1 "$1" -c "$2"; }
# with_db ADMIN_URL NAME: the URL of database NAME on ADMIN_URL's server(s).
with_db() {
	local base=${1%%\?*} query=${1#"${1%%\?*}"}
	echo "${base%/*}/$2$query"
}
# member_admin: the URL of the postgres database on the cluster's primary.
member_admin() {
	local name port
	read -r name port < <(./scripts/ha.sh primary)
	[ -n "$port" ] || die "the HA cluster has no primary (./scripts/ha.sh status)"
	echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
}
cleanup() {
	stop_service
	for k in "${!sampler_pid[@]}"; do kill "${sampler_pid[$k]}" 2>/dev/null || true; done
	if [ "$ha_created" = 1 ]; then
		primary_admin=$(member_admin 2>/dev/null || echo "$primary_admin")
		psql -qX "$primary_admin" -c "ALTER DATABASE $db RESET synchronous_commit" >/dev/null 2>&1 || true
		psql -qX "$primary_admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	fi
	if [ "$local_created" = 1 ]; then
		psql -qX "$local_admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	fi
	if [ -n "$nats_pid" ]; then kill "$nats_pid" 2>/dev/null || true; wait "$nats_pid" 2>/dev/null || true; fi
	if [ -n "$nats_dir" ]; then rm -rf "$nats_dir"; fi
	rm -rf "$tmp_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# field NAME RUN: a value from that run's JSON line in $results.
field() { grep "\"scenario\":\"$2\"" "$results" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
# errors RUN: its error counts by status, e.g. "503: 3", or 0.
errors() {
	local e
	e=$(grep "\"scenario\":\"$1\"" "$results" | sed -n 's/.*"errors":{\([^}]*\)}.*/\1/p' | sed 's/"//g; s/:/: /g; s/,/, /g')
	echo "${e:-0}"
}

# --- The cluster, the scratch databases, the binaries ------------------------------
say "make ha-up (starts the HA cluster if it is not running)"
ha_url=$(./scripts/ha.sh up)
primary_admin=$(member_admin)
read -r primary_name primary_port < <(./scripts/ha.sh primary)
read -r standby_name standby_port < <(./scripts/ha.sh standby)
standby_admin="postgres://postgres@127.0.0.1:$standby_port/postgres?sslmode=disable"
say "primary $primary_name ($primary_port), synchronous standby $standby_name ($standby_port)"

create_db="CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
psql_at "$primary_admin" "$create_db" >/dev/null || die "cannot create $db on the cluster's primary"
ha_created=1
psql_at "$local_admin" "$create_db" >/dev/null && local_created=1 ||
	die "cannot create a database with $local_admin; set PAYMENTS_BENCH_DATABASE_URL"
# pgx stops at a standby that answers "database does not exist", so the
# multi-host URL is used only once the standby has the database.
for _ in $(seq 300); do
	[ "$(psql_at "$standby_admin" "SELECT count(*) FROM pg_database WHERE datname = '$db'" 2>/dev/null)" = 1 ] && break
	sleep 0.1
done
[ "$(psql_at "$standby_admin" "SELECT count(*) FROM pg_database WHERE datname = '$db'")" = 1 ] ||
	die "the standby did not have database $db within 30 s"
ha_db=$(with_db "$ha_url" "$db")              # the multi-host URL: the service's, as deployed
ha_primary_db=$(with_db "$primary_admin" "$db") # the primary alone: ALTER DATABASE, CHECKPOINT, statistics
local_db=$(with_db "$local_admin" "$db")

say "building bin/payments and bin/paymentsbench"
"$GO" build -o bin/payments ./cmd/payments
"$GO" build -o bin/paymentsbench ./cmd/paymentsbench
new_merchant "$ha_db"
ha_key=$api_key
new_merchant "$local_db"
local_key=$api_key
start_nats
make_pgbench_shim "$tmp_dir/shim"

# The settings that could matter, on the primary and on the single server, and
# the names of every other setting whose value differs (paths, ports and the
# replication connection aside).
shown="fsync synchronous_commit synchronous_standby_names wal_level wal_log_hints wal_sync_method full_page_writes wal_compression commit_delay max_wal_size checkpoint_timeout shared_buffers max_connections autovacuum"
settings_rows=''
for s in $shown; do
	settings_rows+="| $s | $(psql_at "$primary_admin" "SHOW $s") | $(psql_at "$local_admin" "SHOW $s") |"$'\n'
done
all_settings="SELECT name || '=' || setting FROM pg_settings WHERE name NOT IN
  ('port', 'data_directory', 'config_file', 'hba_file', 'ident_file', 'external_pid_file', 'unix_socket_directories',
   'listen_addresses', 'cluster_name', 'log_directory', 'log_filename', 'primary_conninfo', 'primary_slot_name',
   'ssl_cert_file', 'ssl_key_file', 'shared_memory_size', 'shared_memory_size_in_huge_pages') ORDER BY name"
other_diffs=$(diff <(psql_at "$primary_admin" "$all_settings") <(psql_at "$local_admin" "$all_settings") |
	sed -n 's/^[<>] \([^=]*\)=.*/\1/p' | sort -u | grep -vxF -f <(tr ' ' '\n' <<<"$shown") | paste -sd, - | sed 's/,/, /g' || true)
pg_version=$(psql_at "$primary_admin" "SHOW server_version")
pg_version_local=$(psql_at "$local_admin" "SHOW server_version")

# Other users of each server: every second, the sessions active in databases
# that are not this run's (its scratch database, pg-reference's); lines
# "unix_ms count" in bin/bench-sync-others-SERVER.txt.
# start_others_sampler NAME ADMIN_URL
start_others_sampler() {
	printf '%s\n' "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint, count(*) FILTER (WHERE state = 'active'" \
		"AND backend_type = 'client backend' AND pid <> pg_backend_pid()" \
		"AND datname NOT LIKE 'syncbench%' AND datname NOT LIKE 'payments_reference%') FROM pg_stat_activity \\watch 1" |
		psql -qXAt -F' ' "$2" >"bin/bench-sync-others-$1.txt" 2>/dev/null &
	sampler_pid[$1]=$!
}
# others NAME: "P % of the samples, mean M" of that server's other active sessions.
others() {
	awk 'NF == 2 { n++; s += $2; if ($2 > 0) busy++ } END { if (n) printf "%.0f %% of %d samples, %.1f on average, at most", 100 * busy / n, n, s / n; else printf "no samples" }' "bin/bench-sync-others-$1.txt"
	awk 'NF == 2 && $2 > m { m = $2 } END { printf " %d\n", m }' "bin/bench-sync-others-$1.txt"
}
start_others_sampler cluster "$primary_admin"
start_others_sampler single "$local_admin"

# --- The rounds ----------------------------------------------------------------------
# run_config CONFIG ROUND: one configuration's turn in a round.
run_config() {
	local cfg=$1 r=$2 database key admin_url opts='' n
	case $cfg in
	A | B) database=$ha_db key=$ha_key admin_url=$primary_admin ;;
	C) database=$local_db key=$local_key admin_url=$local_admin ;;
	esac
	if [ "$cfg" = B ]; then
		psql_at "$ha_primary_db" "ALTER DATABASE $db SET synchronous_commit = local" >/dev/null
		[ "$(psql_at "$ha_primary_db" 'SHOW synchronous_commit')" = local ] ||
			die "ALTER DATABASE $db SET synchronous_commit = local did not reach a new session"
		opts='-c synchronous_commit=local'
	fi
	psql_at "$(with_db "$admin_url" "$db")" CHECKPOINT >/dev/null
	start_service "$database" "bin/bench-sync-server-$cfg-r$r.log"
	for n in $client_counts; do
		clients=$n run_fresh "$cfg-c$n-r$r" "$key" -d "${seconds}s" || lost+=("$cfg-c$n-r$r")
	done
	stop_service
	if [ "$cfg" = B ]; then psql_at "$ha_primary_db" "ALTER DATABASE $db RESET synchronous_commit" >/dev/null; fi
	for n in $client_counts; do
		PGOPTIONS=$opts admin=$admin_url pgref "$n" "$cfg-ref-c$n-r$r" || lost+=("$cfg-ref-c$n-r$r")
	done
}

say "$rounds rounds of A (sync standby), B (synchronous_commit=local), C (single server);" \
	"fresh at $client_counts clients, ${seconds} s a run"
for r in $(seq "$rounds"); do
	# A healthy cluster with the same primary, its standby synchronous.
	HA_WAIT=30 ./scripts/ha.sh wait >/dev/null || die "the HA cluster is not healthy (./scripts/ha.sh status)"
	[ "$(member_admin)" = "$primary_admin" ] || die "the primary moved during the run: the rounds are not comparable"
	sync_state=$(psql_at "$primary_admin" "SELECT string_agg(application_name || ' ' || sync_state, ', ') FROM pg_stat_replication")
	[[ $sync_state == "$standby_name sync" ]] || die "pg_stat_replication on the primary: '$sync_state', not '$standby_name sync'"
	order=(A B C)
	[ $((r % 2)) -eq 1 ] || order=(C B A)
	say "round $r of $rounds (${order[*]})"
	for cfg in "${order[@]}"; do run_config "$cfg" "$r"; done
done

# What autovacuum did on the cluster's scratch database (the single server has
# it off), and the dead rows each was left with.
table_stats="SELECT coalesce(sum(autovacuum_count), 0) || ' ' || coalesce(sum(autoanalyze_count), 0) || ' ' ||
  coalesce(sum(n_dead_tup), 0) || ' ' || coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables"
read -r av_ha aa_ha dead_ha live_ha < <(psql_at "$ha_primary_db" "$table_stats")
read -r av_local aa_local dead_local live_local < <(psql_at "$local_db" "$table_stats")
for k in "${!sampler_pid[@]}"; do kill "${sampler_pid[$k]}" 2>/dev/null || true; wait "${sampler_pid[$k]}" 2>/dev/null || true; done
sampler_pid=()
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$((SECONDS - began))

# --- The section ---------------------------------------------------------------------
# med FIELD RUNS_REGEX: the median of FIELD over the runs whose name matches.
med() { { grep -E "\"scenario\":\"$2\"" "$results" || true; } | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | median; }
# ref COLUMN TAG: a column of a pg-reference line (3 tps, 5 p50, 6 p99).
ref() { awk -v t="$2" -v c="$1" '$1 == t { print $c }' "$pgref_results"; }
# per_round EXPR CFG N: the median over the rounds of an awk expression of
# a (the run's charges/s), p (its p50), f (its reference tps) and, for
# another configuration's run in the same round, b and q (charges/s, p50):
# per_round 'a / f' A 16, or per_round 'a / b' A 16 C.
per_round() {
	local expr=$1 cfg=$2 n=$3 other=${4:-} r a p f b q
	for r in $(seq "$rounds"); do
		a=$(field charges_per_s "$cfg-c$n-r$r") p=$(field p50_ms "$cfg-c$n-r$r") f=$(ref 3 "$cfg-ref-c$n-r$r")
		b='' q=''
		if [ -n "$other" ]; then b=$(field charges_per_s "$other-c$n-r$r") q=$(field p50_ms "$other-c$n-r$r"); fi
		[ -n "$a" ] && [ -n "$f" ] && { [ -z "$other" ] || [ -n "$b" ]; } || continue
		awk -v a="$a" -v p="$p" -v f="$f" -v b="${b:-0}" -v q="${q:-0}" "BEGIN { printf \"%.3f\\n\", $expr }"
	done | median
}
fmt() { if [ -z "$1" ]; then echo "—"; else awk -v v="$1" -v d="$2" 'BEGIN { printf "%.*f", d, v }'; fi; }
declare -A label=([A]="A: HA primary, synchronous standby" [B]="B: HA primary, synchronous_commit=local" [C]="C: single server (127.0.0.1:5432)")

summary='' paired='' runs=''
for n in $client_counts; do
	for cfg in A B C; do
		summary+="| ${label[$cfg]} | $n | $(fmt "$(med charges_per_s "$cfg-c$n-r[0-9]+")" 0) | $(fmt "$(med p50_ms "$cfg-c$n-r[0-9]+")" 2) | $(fmt "$(med p99_ms "$cfg-c$n-r[0-9]+")" 2) |"
		summary+=" $(fmt "$(awk -v t="^$cfg-ref-c$n-r[0-9]+\$" '$1 ~ t { print $3 }' "$pgref_results" | median)" 0) |"
		summary+=" $(fmt "$(awk -v t="^$cfg-ref-c$n-r[0-9]+\$" '$1 ~ t && $5 != "?" { print $5 }' "$pgref_results" | median)" 2) |"
		summary+=" $(fmt "$(per_round 'a / f' "$cfg" "$n")" 2) |"$'\n'
	done
	paired+="| $n | $(fmt "$(per_round 'a / b' A "$n" C)" 2) | $(fmt "$(per_round 'a / b' A "$n" B)" 2) | $(fmt "$(per_round 'a / b' B "$n" C)" 2) |"
	paired+=" $(fmt "$(per_round 'p - q' A "$n" B)" 2) | $(fmt "$(per_round 'p - q' A "$n" C)" 2) |"$'\n'
done
for r in $(seq "$rounds"); do
	order=(A B C)
	[ $((r % 2)) -eq 1 ] || order=(C B A)
	for cfg in "${order[@]}"; do
		for n in $client_counts; do
			t="$cfg-c$n-r$r"
			verified=$([ "$(field verified "$t")" = true ] && echo verified || echo "**MISMATCH**")
			runs+="| $t | $(field charges_per_s "$t") | $(field p50_ms "$t") | $(field p99_ms "$t") | $(errors "$t") | $verified |"
			runs+=" $(ref 3 "$cfg-ref-c$n-r$r") | $(ref 5 "$cfg-ref-c$n-r$r") | $(ref 6 "$cfg-ref-c$n-r$r") |"$'\n'
		done
	done
done
warnings=$(log_warnings bin/bench-sync-server-*.log)
repro="BENCH_SECONDS=$seconds BENCH_SYNC_ROUNDS=$rounds BENCH_SYNC_CLIENTS='$client_counts' make bench-sync"
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain)" ] || commit="$commit with uncommitted changes"

section=$tmp_dir/section.md
cat >"$section" <<EOF
<!-- bench-sync:begin -->
## The cost of synchronous replication (issue 15)

Written by \`make bench-sync\` (\`scripts/bench-sync.sh\`), apart from the rest
of this file; reproduce with:

    $repro

The same \`bin/payments\` and \`bin/paymentsbench\`, the fresh scenario (a new
key per request, charges of 100 over 1,000 new accounts per run), ${seconds} s a
run, in three configurations on this one machine:

- **A**: the service on the HA cluster of \`make ha-up\` (Patroni, primary
  $primary_name on 127.0.0.1:$primary_port, synchronous standby $standby_name on
  127.0.0.1:$standby_port, strict mode) through its multi-host \`DATABASE_URL\`:
  every commit waits until the standby has flushed it.
- **B**: the same cluster and database with
  \`ALTER DATABASE $db SET synchronous_commit = local\` (the service restarted
  to pick it up, reset after each run): commits no longer wait for the
  standby, which still receives and replays the WAL. A against B isolates the
  wait on identical hardware and configuration.
- **C**: the single local PostgreSQL, as the README's default setup.

$rounds rounds, each configuration's turn being a CHECKPOINT on its server, a
fresh service, the runs at each client count ($client_counts), then
\`pg-reference\` on the same server at the same counts (for B with
\`PGOPTIONS='-c synchronous_commit=local'\`, so that its ceiling does not wait
either). The order alternates, A B C then C B A, so that the load of
whatever else runs on the machine falls on all three alike. Each figure is the
median over the rounds; the ratios are taken within each round, then their
median. Each configuration's ratio to pg-reference is to its own server's
ceiling, which the wait for the standby lowers too: across configurations,
compare the charges/s and latencies themselves.

| configuration | clients | charges/s | p50 ms | p99 ms | pg-reference tps | its p50 ms | charges/s ÷ pg-reference |
|---|---:|---:|---:|---:|---:|---:|---:|
$summary
Paired within each round (medians of the per-round figures):

| clients | charges/s A ÷ C | A ÷ B | B ÷ C | p50 A − B ms | p50 A − C ms |
|---|---:|---:|---:|---:|---:|
$paired
### What differs between the two servers

\`SHOW\` on the cluster's primary and on the single server, at the start of the run:

| setting | HA primary | single server |
|---|---|---|
$settings_rows
Every other setting with a different value: ${other_diffs:-none} (paths,
ports and the standby's connection aside). Every connection here uses
\`sslmode=disable\`.

Autovacuum runs on the cluster and is off on the single server. Over this
run, on the scratch database $db, autovacuum vacuumed tables $av_ha times and
analyzed them $aa_ha times on the cluster ($dead_ha dead rows left of
$live_ha live at the end), against $av_local and $aa_local on the single
server ($dead_local dead rows left of $live_local live). Its work during A and
B is work C did not have; C's tables instead keep their dead rows. A ÷ B,
both on the cluster, is not affected by this or by the other differences
above; A ÷ C and B ÷ C are.

Other users of the servers, sampled every second over the whole run: sessions
active in databases other than this run's were seen in $(others single)
on the single server, and in $(others cluster) on the
cluster's primary.

On this machine the standby shares the primary's CPUs and disk, and the
round trip to it is over loopback: B ÷ C includes the standby's receiving and
replaying the WAL on the same CPUs, and no figure here includes a network
between the two servers.

### The runs

Run names are CONFIGURATION-cCLIENTS-rROUND, in the order they ran; the last
three columns are the pg-reference run that followed (tps, and the p50 and p99
of its transactions from pgbench's log, in ms).

| run | charges/s | p50 ms | p99 ms | errors | balances | pg-reference tps | p50 ms | p99 ms |
|---|---:|---:|---:|---|---|---:|---:|---:|
$runs
| | |
|---|---|
| date | $(date -u '+%Y-%m-%d %H:%M UTC') |
| CPU | $(nproc) × $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1) |
| load average | $load_before before, $load_after after (1, 5, 15 min; anything else running shares the CPUs) |
| PostgreSQL | $pg_version (cluster), $pg_version_local (single server) |
| Go | $("$GO" version | sed 's/^go version //') |
| commit | $commit |
| service | \`payments serve\`, defaults (DB_MAX_CONNS 20, COMMIT_WAIT 5s); its relay publishes to a NATS of the run's own |
| service warnings | ${warnings:-none} |
| run time | $elapsed s |
<!-- bench-sync:end -->
EOF
# The section replaces the previous one, or goes at the end.
if grep -qx '<!-- bench-sync:begin -->' "$report" 2>/dev/null; then
	awk -v f="$section" '
		$0 == "<!-- bench-sync:begin -->" { while ((getline l < f) > 0) print l; skip = 1; next }
		$0 == "<!-- bench-sync:end -->" { skip = 0; next }
		!skip' "$report" >"$tmp_dir/report" && cat "$tmp_dir/report" >"$report"
else
	{ [ ! -s "$report" ] || echo; cat "$section"; } >>"$report"
fi
say "wrote the section of $report in ${elapsed}s"
sed -n '/^| configuration/,/^$/p' "$section" >&2
[ ${#lost[@]} -eq 0 ] || say "WARNING: runs without a result: ${lost[*]}"
[ ${#failed[@]} -eq 0 ] || die "balances did not match in: ${failed[*]} (see $results)"
