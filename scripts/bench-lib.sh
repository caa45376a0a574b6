# bench-lib.sh: functions scripts/bench-pair.sh and batch-cost.sh source; not
# meant to run on its own. make bench and make bench-sync are Go
# (cmd/benchrun, on internal/benchrun), which does the same in tested code.
#
# They use the caller's variables server_pid, port, url, metrics_port and
# service_bin, and its say and die.

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

# median: the median of the numbers on stdin.
median() {
	sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
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
