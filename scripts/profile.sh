#!/usr/bin/env bash
# profile.sh: a CPU profile of the service under the fresh-charge load
# (`make profile` calls it). Creates a scratch database, starts bin/payments
# with PPROF_ADDR on loopback, runs paymentsbench's fresh scenario with
# PROFILE_CLIENTS clients (default 16) for PROFILE_SECONDS + 4 seconds
# (default 15), takes a PROFILE_SECONDS profile in the middle of it, and
# prints the top functions by cumulative and by flat CPU. The profile is kept
# at PROFILE_OUT (default bin/fresh.pprof): `go tool pprof -http=: bin/payments
# bin/fresh.pprof` browses it.
#
# PAYMENTS_BIN picks another build of the service (for a before/after pair);
# PAYMENTS_BENCH_DATABASE_URL, else PAYMENTS_TEST_DATABASE_URL, a server where
# this may CREATE DATABASE (default the local one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
seconds=${PROFILE_SECONDS:-15}
clients=${PROFILE_CLIENTS:-16}
out=${PROFILE_OUT:-bin/fresh.pprof}
admin=${PAYMENTS_BENCH_DATABASE_URL:-${PAYMENTS_TEST_DATABASE_URL:-postgres://postgres@localhost:5432/postgres?sslmode=disable}}
mkdir -p bin
"$GO" -C lab build -o ../bin/paymentsbench ./cmd/paymentsbench
bin=${PAYMENTS_BIN:-bin/payments}
[ -n "${PAYMENTS_BIN:-}" ] || "$GO" build -o bin/payments ./cmd/payments

db=payments_profile_$$
base=${admin%%\?*} query=${admin#"$base"}
[[ $query == "$admin" ]] && query=
url_db="${base%/*}/$db$query"
pid=''
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
psql -qX "$admin" -c "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'" >/dev/null
DATABASE_URL=$url_db "$bin" migrate up >/dev/null
creds=$(DATABASE_URL=$url_db "$bin" merchants create --name profile)
api_key=$(sed -n 's/.*"api_key"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$creds")
port=$((20000 + RANDOM % 20000)) pport=$((40000 + RANDOM % 20000))
# One merchant at full speed: its budgets (RATE_LIMIT_*) would cap what is profiled.
env DATABASE_URL=$url_db HTTP_ADDR=127.0.0.1:$port PPROF_ADDR=127.0.0.1:$pport METRICS_ADDR=127.0.0.1:0 RELAY_ENABLED=false SHUTDOWN_DELAY=0 \
	RATE_LIMIT_READS=0 RATE_LIMIT_WRITES=0 ${PROFILE_ENV:-} \
	"$bin" serve >bin/profile-server.log 2>&1 &
pid=$!
PAYMENTS_API_KEY=$api_key bin/paymentsbench -url "http://127.0.0.1:$port" -c "$clients" -d "$((seconds + 4))s" \
	-scenarios fresh ${PROFILE_BENCH_ARGS:-} >bin/profile-bench.txt 2>&1 &
bench=$!
sleep 3
curl -sf -o "$out" "http://127.0.0.1:$pport/debug/pprof/profile?seconds=$seconds"
wait "$bench"
cat bin/profile-bench.txt
"$GO" tool pprof -top -cum -nodecount=35 "$bin" "$out" 2>/dev/null | sed -n '1,45p'
"$GO" tool pprof -top -nodecount=25 "$bin" "$out" 2>/dev/null | sed -n '6,35p'
