# bench-lib.sh: functions scripts/bench.sh sources; not meant to run on its own.
#
# They use the caller's variables: admin, clients, seconds, results, failed,
# server_pid, port, url, metrics_port, metrics_sampler_pid, service_bin, shared,
# pgbench_shim, pgref_results, holder_pid, holder_backend, nats_pid, nats_dir
# (see bench.sh), and its say and die. scripts/bench-sync.sh, bench-pair.sh and
# batch-cost.sh source them too.

# start_service DATABASE_URL LOG [VAR=value ...]: starts `payments serve` on a
# loopback port the kernel picks (its metrics on another, METRICS_ADDR, or on
# the API port for a build from before it), with the given environment on top
# of the defaults, and waits until GET /readyz answers 200. Sets server_pid,
# port, url, metrics_port.
# The binary is $service_bin, bin/payments when that is empty.
start_service() {
	local database=$1 log=$2 addr=''
	shift 2
	env DATABASE_URL="$database" HTTP_ADDR=127.0.0.1:0 METRICS_ADDR=127.0.0.1:0 METRICS_SAMPLE=1s LOG_LEVEL="${BENCH_LOG_LEVEL:-info}" "$@" \
		"${service_bin:-bin/payments}" serve >"$log" 2>&1 &
	server_pid=$!
	for _ in $(seq 100); do
		addr=$(sed -n 's/.*"msg":"listening".*"addr":"\([^"]*\)".*/\1/p' "$log" | head -n 1)
		[ -n "$addr" ] && break
		kill -0 "$server_pid" 2>/dev/null || break
		sleep 0.1
	done
	[ -n "$addr" ] || die "payments serve did not start listening; the end of $log:" "$(tail -n 20 "$log")"
	port=${addr##*:}
	url="http://127.0.0.1:$port"
	for _ in $(seq 100); do ready && break; sleep 0.1; done
	ready || die "$url/readyz did not answer 200 within 10s; see $log"
	addr=$(sed -n 's/.*"msg":"metrics listening".*"addr":"\([^"]*\)".*/\1/p' "$log" | head -n 1)
	metrics_port=${addr##*:}
	metrics_port=${metrics_port:-$port}
}

# stop_service: SIGTERM, then wait for the drain to finish.
stop_service() {
	if [ -n "$server_pid" ]; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	server_pid=''
}

# ready: whether GET /readyz answers 200 (bash's /dev/tcp, so curl is not needed).
ready() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
		printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
		read -r _ status _ <&3
		[ "$status" = 200 ]
	) 2>/dev/null
}

# scrape: GET /metrics of the running service, in the Prometheus text format.
scrape() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$metrics_port" || exit 1
		printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
		cat <&3
	) 2>/dev/null | tr -d '\r'
}

# sample: one line of the metrics the targets need, in this order:
#   unix_ms gc_cycles heap_inuse_bytes heap_alloc_bytes cache_entries keys_in_flight
#   janitor_deleted goroutines outbox_backlog oldest_unpublished_seconds
# It fails when /metrics did not answer.
sample() {
	scrape | awk -v ms="$(date +%s%3N)" '
		$1 == "go_gc_duration_seconds_count" { v[1] = $2 }
		$1 == "go_memstats_heap_inuse_bytes" { v[2] = $2 }
		$1 == "go_memstats_heap_alloc_bytes" { v[3] = $2 }
		$1 == "payments_idempotency_cache_entries" { v[4] = $2 }
		$1 == "payments_idempotency_keys_in_flight" { v[5] = $2 }
		$1 == "payments_janitor_deleted_keys_total" { v[6] = $2 }
		$1 == "go_goroutines" { v[7] = $2 }
		$1 == "payments_outbox_backlog_events" { v[8] = $2 }
		$1 == "payments_outbox_oldest_unpublished_seconds" { v[9] = $2 }
		END {
			if (!(1 in v) || !(6 in v) || !(8 in v)) exit 1
			printf "%s", ms
			for (i = 1; i <= 8; i++) printf " %.0f", v[i]
			printf " %.1f\n", v[9]
		}'
}

# start_metrics_sampler FILE INTERVAL / stop_metrics_sampler: sample in the
# background every INTERVAL seconds.
start_metrics_sampler() {
	(
		while :; do
			sample || true
			sleep "$2"
		done
	) >"$1" 2>/dev/null &
	metrics_sampler_pid=$!
}
stop_metrics_sampler() {
	if [ -n "$metrics_sampler_pid" ]; then
		kill "$metrics_sampler_pid" 2>/dev/null || true
		wait "$metrics_sampler_pid" 2>/dev/null || true
	fi
	metrics_sampler_pid=''
}

# settle_heap FILE TIMEOUT: polls /metrics every 0.1 s until the service is idle
# (the relay has published the whole outbox backlog the run left) and then two
# GC cycles have completed: one cycle leaves what sync.Pool holds in its victim
# cache, the second frees it. At idle only the scrapes allocate, so the runtime
# keeps collecting. Prints the first sample after the second cycle, then the
# seconds until idle, the seconds in all, and 1 (settled) or 0 (TIMEOUT passed
# first: the last sample). Every sample goes to FILE.
settle_heap() {
	local file=$1 timeout=$2 began=$SECONDS line='' gc0='' idle=-1 gc backlog
	: >"$file"
	while :; do
		if line=$(sample); then
			echo "$line" >>"$file"
			read -r _ gc _ _ _ _ _ _ backlog _ <<<"$line"
			if [ -z "$gc0" ]; then
				if [ "$backlog" -eq 0 ]; then gc0=$gc idle=$((SECONDS - began)); fi
			elif [ "$gc" -ge $((gc0 + 2)) ]; then
				echo "$line $idle $((SECONDS - began)) 1"
				return
			fi
		fi
		if [ $((SECONDS - began)) -ge "$timeout" ]; then
			echo "${line:-0 0 0 0 0 0 0 0 0 0} $idle $((SECONDS - began)) 0"
			return
		fi
		sleep 0.1
	done
}

# run_fresh TAG API_KEY [paymentsbench flags]: runs the fresh scenario against
# the running service and appends its JSON line to $results, named TAG instead
# of fresh, and the 1-minute load average after it in run_load[TAG]. A balance
# mismatch adds TAG to failed; it fails only when
# paymentsbench gave no result at all (the reason is in bin/bench-TAG.err).
run_fresh() {
	local tag=$1 key=$2 rc=0 out
	shift 2
	out=$(PAYMENTS_API_KEY=$key bin/paymentsbench -url "$url" -c "$clients" -scenarios fresh -json "$@" \
		2>"bin/bench-$tag.err") || rc=$?
	[ -s "bin/bench-$tag.err" ] || rm -f "bin/bench-$tag.err"
	out=$(grep '"scenario":"fresh"' <<<"$out" || true)
	if [ -z "$out" ]; then
		say "paymentsbench gave no result for $tag (exit $rc): $(tail -n 3 "bin/bench-$tag.err" 2>/dev/null)"
		return 1
	fi
	sed "s/\"scenario\":\"fresh\"/\"scenario\":\"$tag\"/" <<<"$out" >>"$results"
	run_load[$tag]=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
	[ "$rc" -eq 0 ] || failed+=("$tag")
	say "  $tag: $(field requests "$tag") requests, $(field req_per_s "$tag") req/s," \
		"p50 $(field p50_ms "$tag") ms, p99 $(field p99_ms "$tag") ms, errors $(errors "$tag"), verified $(field verified "$tag")"
}

# seed_keys DATABASE_URL MERCHANT TAG FROM TO CREATED_AT: inserts keys FROM..TO
# in one statement, as the service stores a completed charge: a UUID-shaped key
# (random order in the primary key, as clients' keys are), a 32-byte
# fingerprint, status 201, a Location and a ~280-byte JSON body like a real
# charge response. CREATED_AT is an SQL expression in i (the series number).
seed_keys() {
	timeout 900 psql -qX -v ON_ERROR_STOP=1 "$1" -c "
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, status, location, body, created_at)
SELECT '$2'::uuid, k, sha256(convert_to(k, 'UTF8')), 201, '/v1/charges/ch_' || h,
       convert_to('{\"id\":\"ch_' || h || '\",\"object\":\"charge\",\"account_id\":\"acct_' || md5(k || 'a')
           || '\",\"amount\":100,\"currency\":\"USD\",\"status\":\"succeeded\",\"failure_code\":null,'
           || '\"amount_refunded\":0,\"description\":null,\"metadata\":{},\"created_at\":\"'
           || to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') || '\"}', 'UTF8'),
       t
FROM generate_series($4, $5) i,
     LATERAL (SELECT md5('seed-$3-' || i)::uuid::text AS k, md5('ch-$3-' || i) AS h, $6 AS t) s"
}

# after_seeding DATABASE_URL: what a deployed database would have done by
# itself (autovacuum's ANALYZE, a checkpoint) so it does not land in the
# measured window instead.
after_seeding() {
	timeout 900 psql -qX -v ON_ERROR_STOP=1 "$1" -c 'VACUUM (ANALYZE) idempotency_keys' -c 'CHECKPOINT'
}

# log_warnings LOG...: distinct WARN and ERROR messages in the service logs, with
# counts, except "NATS disconnected", which every shutdown logs.
log_warnings() {
	cat "$@" 2>/dev/null | { grep -E '"level":"(WARN|ERROR)"' || true; } | { grep -v '"msg":"NATS disconnected"' || true; } |
		sed -n 's/.*"level":"\([A-Z]*\)".*"msg":"\([^"]*\)".*/\1 \2/p' | sort | uniq -c |
		awk '{ n = $1; $1 = ""; printf "%s%s ×%d", sep, substr($0, 2), n; sep = "; " }'
}

# median: the median of the numbers on stdin.
median() {
	sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# mib BYTES: BYTES in MiB, one decimal.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# percentiles Q...: the nearest-rank quantiles Q (0..1) of the numbers on
# stdin, on one line, three decimals each; "?" for each when there are none.
percentiles() {
	sort -g | awk -v qs="$*" '
		{ a[NR] = $1 }
		END {
			n = split(qs, q, " ")
			for (i = 1; i <= n; i++) {
				k = int(q[i] * NR); if (k < q[i] * NR) k++; if (k < 1) k = 1
				printf "%s%s", (i > 1 ? " " : ""), (NR ? sprintf("%.3f", a[k]) : "?")
			}
			print ""
		}'
}

# mean [DIGITS]: the mean of the numbers on stdin (default 1 decimal); empty
# when there are none.
mean() { awk -v d="${1:-1}" '{ s += $1; n++ } END { if (n) printf "%.*f\n", d, s / n }'; }

# pgref CLIENTS TAG: runs pg-reference -c CLIENTS -T $seconds, its pgbench
# logging every transaction's latency (the shim $pgbench_shim/pgbench adds -l),
# and appends "TAG CLIENTS tps avg_ms p50_ms p99_ms" to $pgref_results. It
# fails when pg-reference does.
pgref() {
	local n=$1 tag=$2 dir out tps avg p50 p99
	dir=$(mktemp -d)
	if ! out=$(PATH="$pgbench_shim:$PATH" BENCH_PGBENCH_LOG="$dir/log" \
		"$shared/bench/pg-reference" -c "$n" -T "$seconds" -d "$admin" 2>&1); then
		say "pg-reference -c $n failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
		rm -rf "$dir"
		return 1
	fi
	tps=$(sed -n 's/^reference_tps=//p' <<<"$out" | awk '{ printf "%.1f", $1 }')
	avg=$(sed -n 's/.*latency_avg_ms=\([0-9.]*\).*/\1/p' <<<"$out")
	# pgbench's per-transaction log: client, transaction, latency in µs, ...
	read -r p50 p99 < <(cat "$dir"/log.* 2>/dev/null | awk '{ print $3 / 1000 }' | percentiles 0.5 0.99)
	rm -rf "$dir"
	echo "$tag $n $tps ${avg:-?} $p50 $p99" >>"$pgref_results"
	say "  pg-reference -c $n ($tag): $tps tps, avg ${avg:-?} ms, p50 $p50 ms, p99 $p99 ms"
}

# pgref_field TAG COLUMN: a column (3 tps, 4 avg, 5 p50, 6 p99) of a pgref line.
pgref_field() { awk -v t="$1" -v c="$2" '$1 == t { print $c }' "$pgref_results"; }

# hold_key DATABASE_URL MERCHANT KEY OUT: holds KEY of MERCHANT in flight the way
# another replica of the service would: a session that takes the key's
# advisory lock and inserts its row (no response yet), then stays in its
# transaction (pg_sleep) until release_key. Waits until it holds the key; sets
# holder_pid (the psql) and holder_backend (its server process). OUT gets psql's output.
hold_key() {
	local i
	psql -qXAt -v ON_ERROR_STOP=1 "$1" >"$4" 2>&1 <<SQL &
BEGIN;
SELECT 'backend', pg_backend_pid();
SELECT pg_advisory_xact_lock(hashtextextended('$2'::uuid::text || '$3', 0));
INSERT INTO idempotency_keys (merchant_id, key, fingerprint) VALUES ('$2', '$3', '\x00');
SELECT 'held';
SELECT pg_sleep(3600);
ROLLBACK;
SQL
	holder_pid=$!
	for i in $(seq 100); do
		grep -qx held "$4" && break
		kill -0 "$holder_pid" 2>/dev/null || break
		sleep 0.1
	done
	holder_backend=$(sed -n 's/^backend|//p' "$4")
	if ! grep -qx held "$4" || [ -z "$holder_backend" ]; then
		say "could not hold the key: $(tr '\n' ' ' <"$4")"
		release_key
		return 1
	fi
}

# release_key: ends the session of hold_key; its transaction rolls back.
release_key() {
	if [ -n "$holder_backend" ]; then
		psql -qXAt "$admin" -c "SELECT pg_terminate_backend($holder_backend)" >/dev/null 2>&1 || true
	fi
	if [ -n "$holder_pid" ]; then
		kill "$holder_pid" 2>/dev/null || true
		wait "$holder_pid" 2>/dev/null || true
	fi
	holder_pid='' holder_backend=''
}

# new_merchant DATABASE_URL [BINARY]: migrates (with BINARY's migrations,
# default bin/payments) and creates a merchant; sets api_key, merchant_id.
new_merchant() {
	local creds bin=${2:-bin/payments}
	DATABASE_URL=$1 "$bin" migrate up >/dev/null
	creds=$(DATABASE_URL=$1 "$bin" merchants create --name bench)
	api_key=$(sed -n 's/.*"api_key"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$creds")
	merchant_id=$(sed -n 's/.*"merchant_id"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$creds")
	[ -n "$api_key" ] && [ -n "$merchant_id" ] ||
		die "no api_key or merchant_id in the output of 'payments merchants create': $creds"
}

# start_nats: the services' relays publish to a NATS of the run's own, on a
# random port, so benchmarks do not fill the machine's shared one; it goes
# with the run (the caller's cleanup kills nats_pid and removes nats_dir).
# Exports NATS_URL. Without nats-server the relay publishes to NATS_URL
# (default nats://127.0.0.1:4222), as it would anyway.
start_nats() {
	local nats_addr=''
	if ! command -v nats-server >/dev/null 2>&1; then
		say "nats-server not found: the relay publishes to NATS_URL (default nats://127.0.0.1:4222)"
		return
	fi
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
}

# make_pgbench_shim DIR: a pgbench in DIR (a new directory) that logs every
# transaction to $BENCH_PGBENCH_LOG.*, for the percentiles pg-reference does
# not print (see pgref). Sets pgbench_shim.
make_pgbench_shim() {
	pgbench_shim=$1
	mkdir "$pgbench_shim"
	printf '#!/bin/sh\n# bench-lib.sh: pgbench, logging every transaction to $BENCH_PGBENCH_LOG.*\nexec %q -l --log-prefix="$BENCH_PGBENCH_LOG" "$@"\n' \
		"$(command -v pgbench)" >"$pgbench_shim/pgbench"
	chmod +x "$pgbench_shim/pgbench"
}
