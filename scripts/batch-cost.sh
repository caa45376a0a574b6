#!/usr/bin/env bash
# batch-cost.sh: what a charge batch costs, apart from what each charge in it
# adds (make batch-cost; issue 24).
#
# For each client count in COST_CLIENTS (default "1 4 16"): a new database,
# `payments serve` (bin/payments, built from the working tree) with the relay
# off (COST_RELAY=on: on), a warm-up second, a CHECKPOINT, then paymentsbench's
# fresh scenario over COST_ACCOUNTS (1000) accounts for COST_SECONDS (10) with
# -cpu. The batches come from payments_charge_batches_total around the run.
# One line per client count: charges/s, charges per batch, and the CPU time
# per batch and per charge of PostgreSQL, the service and the whole machine.
# With one client every batch is one charge, so the rows together separate a
# batch's fixed cost from a charge's. Needs PostgreSQL
# (PAYMENTS_TEST_DATABASE_URL or the local server) and, with the relay on,
# NATS at NATS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'batch-cost: %s\n' "$*" >&2; }
die() { say "$@"; exit 1; }
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh # start_service, stop_service, new_merchant, scrape

admin=${PAYMENTS_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
clients_list=${COST_CLIENTS:-1 4 16} seconds=${COST_SECONDS:-10} accounts=${COST_ACCOUNTS:-1000}
relay=false
[ "${COST_RELAY:-off}" = on ] && relay=true
export NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
tck=$(getconf CLK_TCK)
"${GO:-go}" build -o bin/payments ./cmd/payments
"${GO:-go}" build -o bin/paymentsbench ./cmd/paymentsbench

server_pid='' db=''
cleanup() {
	stop_service
	[ -n "$db" ] && psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
	return 0
}
trap cleanup EXIT
base=${admin%%\?*} query=${admin#"$base"}
[[ $query == "$admin" ]] && query=
log=$(mktemp /tmp/batch-cost.XXXXXX)
batches() { scrape | awk '$1 == "payments_charge_batches_total" { print $2 }'; }

printf '| clients | charges/s | charges per batch | PostgreSQL ms per batch | per charge | service ms per batch | per charge | machine ms per charge |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for c in $clients_list; do
	db=batch_cost_$$_$c
	psql -qX "$admin" -c "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null
	db_url="${base%/*}/$db$query"
	new_merchant "$db_url"
	# METRICS_SAMPLE as shipped (start_service samples every second for make bench).
	start_service "$db_url" "$log" METRICS_SAMPLE=15s RELAY_ENABLED=$relay
	bin/paymentsbench -url "$url" -api-key "$api_key" -c "$c" -d 1s -accounts "$accounts" -scenarios fresh >/dev/null
	psql -qX "$db_url" -c CHECKPOINT >/dev/null
	b0=$(batches)
	json=$(bin/paymentsbench -url "$url" -api-key "$api_key" -c "$c" -d "${seconds}s" -accounts "$accounts" \
		-scenarios fresh -json -cpu -service-pid "$server_pid")
	b1=$(batches)
	jq -r --argjson tck "$tck" --argjson n "$((b1 - b0))" --argjson c "$c" '
		def r: . * 1000 | round / 1000;
		def ms(part): 1000 * .cpu_ticks[part] / $tck;
		"| \($c) | \(.charges_per_s) | \(.charges / $n | r) | \(ms("postgres") / $n | r) | \(ms("postgres") / .charges | r) | \(ms("service") / $n | r) | \(ms("service") / .charges | r) | \(ms("machine") / .charges | r) |"' <<<"$json"
	stop_service
	psql -qX "$admin" -c "DROP DATABASE $db" >/dev/null
	db=''
done
rm -f "$log"
