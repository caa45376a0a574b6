#!/usr/bin/env bash
# run.sh: start payments on this machine for development (`make run` calls it).
#
#  1. PostgreSQL: with DATABASE_URL set, that server; else, when a Docker engine
#     answers, the postgres and nats services of docker-compose.yml (nats not when
#     NATS_URL is set), published on POSTGRES_PORT and NATS_PORT, with NATS_URL
#     following NATS_PORT; a port that is already taken is reported with the
#     service and the variable that moves it. Else a PostgreSQL on localhost:5432
#     (user postgres, no password; migrate creates database payments) and
#     whatever NATS answers on NATS_URL, default localhost:4222 (the relay waits
#     for one, events stay in the outbox meanwhile).
#  2. Builds bin/payments (make build), migrates, creates a development merchant.
#  3. Prints a curl session with the merchant's API key, and serves on HTTP_ADDR,
#     with Prometheus metrics on METRICS_ADDR.
#
# Environment: DATABASE_URL, NATS_URL, HTTP_ADDR (default :8080), METRICS_ADDR
# (default 127.0.0.1:9464; off: none), POSTGRES_PORT
# and NATS_PORT (host ports of the Compose postgres and nats, default 5432 and
# 4222).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'run: %s\n' "$*" >&2; }
die() {
	printf 'run: %s\n' "$@" >&2
	exit 1
}
# port_open HOST PORT: whether something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
# port_variable SERVICE: the variable that moves the host port of a Compose service.
port_variable() {
	case $1 in
	postgres) echo POSTGRES_PORT ;;
	nats) echo NATS_PORT ;;
	payments) echo HTTP_PORT ;;
	esac
}
# published_port SERVICE: the host port docker-compose.yml publishes it on.
published_port() {
	case $1 in
	postgres) echo "${POSTGRES_PORT:-5432}" ;;
	nats) echo "${NATS_PORT:-4222}" ;;
	payments) echo "${HTTP_PORT:-8080}" ;;
	esac
}
# clash_hint LOG: what to do about a failed docker compose up whose output is in
# LOG: the service whose port was taken and the variable that moves it.
clash_hint() {
	local service port
	for service in postgres nats payments; do
		port=$(published_port "$service")
		if grep -Eq "[:.]$port\b.*(already allocated|already in use)|(already allocated|already in use).*[:.]$port\b" "$1"; then
			echo "Port $port of $service is taken; move it: $(port_variable "$service")=$((port + 1)) make run"
			return
		fi
	done
	echo "If a port is taken, move it: POSTGRES_PORT (postgres, now $(published_port postgres)) or NATS_PORT (nats, now $(published_port nats)), e.g. POSTGRES_PORT=5433 make run"
}

command -v go >/dev/null 2>&1 ||
	die "Go is not installed (or not on PATH): install Go 1.26 or newer from https://go.dev/dl/ and run make run again."

export HTTP_ADDR=${HTTP_ADDR:-:8080}
export METRICS_ADDR=${METRICS_ADDR:-127.0.0.1:9464}

# --- 1. PostgreSQL ---------------------------------------------------------------
if [ -n "${DATABASE_URL:-}" ]; then
	say "using the PostgreSQL in DATABASE_URL"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
	docker compose version >/dev/null 2>&1 ||
		die "Docker answers, but the Compose plugin is missing ('docker compose version' fails)." \
			"Install Docker Compose v2 (https://docs.docker.com/compose/install/), or set DATABASE_URL to a PostgreSQL of your own."
	pg_port=${POSTGRES_PORT:-5432}
	nats_port=${NATS_PORT:-4222}
	services=(postgres)
	if [ -n "${NATS_URL:-}" ]; then
		say "using the NATS in NATS_URL"
	else
		services+=(nats)
		export NATS_URL="nats://127.0.0.1:$nats_port"
	fi
	# A port taken by something other than this project's own container would
	# make docker compose fail with a message about the port alone.
	running=$(docker compose ps --status running --services 2>/dev/null || true)
	for service in "${services[@]}"; do
		port=$(published_port "$service")
		if ! grep -qx "$service" <<<"$running" && port_open 127.0.0.1 "$port"; then
			die "port $port is taken (another $service, say), and docker compose would publish $service there." \
				"Move it: $(port_variable "$service")=$((port + 1)) make run"
		fi
	done
	where="PostgreSQL on localhost:$pg_port"
	[ "${#services[@]}" -eq 1 ] || where="$where, NATS on localhost:$nats_port"
	say "Docker engine found: starting ${services[*]} with docker compose ($where)"
	compose_log=$(mktemp)
	if ! POSTGRES_PORT=$pg_port NATS_PORT=$nats_port docker compose up -d --wait "${services[@]}" 2>&1 | tee "$compose_log" >&2; then
		hint=$(clash_hint "$compose_log")
		rm -f "$compose_log"
		die "docker compose could not start ${services[*]} (see above)." "$hint"
	fi
	rm -f "$compose_log"
	migrate_hint="The postgres service of docker-compose.yml is on localhost:$pg_port; 'docker compose logs postgres' shows its side."
	export DATABASE_URL="postgres://postgres:postgres@127.0.0.1:$pg_port/payments?sslmode=disable"
else
	say "no Docker engine answers ('docker info' fails): using a PostgreSQL on localhost:5432"
	port_open 127.0.0.1 5432 ||
		die "nothing answers on localhost:5432. Either" \
			"  - start Docker (then make run uses docker compose), or" \
			"  - install and start PostgreSQL (Debian/Ubuntu: sudo apt-get install postgresql), or" \
			"  - set DATABASE_URL to a PostgreSQL of your own: DATABASE_URL=postgres://user:pass@host:5432/payments make run"
	# "payments migrate up" creates database payments when it is missing.
	export DATABASE_URL="postgres://postgres@localhost:5432/payments?sslmode=disable"
	migrate_hint="It connects as user postgres without a password to localhost:5432 and creates database payments if missing;
let that user in (trust for localhost in pg_hba.conf) or set DATABASE_URL to a database of your own."
fi

# --- 2. Build, migrate, development merchant ---------------------------------------
say "building bin/payments"
# make build links the version and commit in (bin/payments version).
"${MAKE:-make}" --no-print-directory build

say "migrating"
bin/payments migrate up ||
	die "'payments migrate up' failed (see above)." "${migrate_hint:-Check the database that DATABASE_URL names.}"

creds=$(bin/payments merchants create --name dev) ||
	die "'payments merchants create --name dev' failed (see above)."
api_key=$(printf '%s\n' "$creds" | sed -n 's/.*"api_key"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
[ -n "$api_key" ] ||
	die "could not read api_key from the output of 'payments merchants create':" "$creds"

# --- 3. The curl session, then serve -------------------------------------------------
host=${HTTP_ADDR%:*}
port=${HTTP_ADDR##*:}
case $host in "" | 0.0.0.0 | "[::]" | "::") host=localhost ;; esac
base="http://$host:$port"
run_id=$(date +%s)

session=$(
	cat <<SESSION
# payments development session: paste into another shell once the service listens.
API_KEY='$api_key'
BASE='$base'
pay() { curl -sS -H "Authorization: Bearer \$API_KEY" -H 'Content-Type: application/json' "\$@"; echo; }

# Open an account; every POST carries an Idempotency-Key.
ACCOUNT=\$(pay -X POST "\$BASE/v1/accounts" -H 'Idempotency-Key: dev-account-$run_id' \\
  -d '{"currency": "EUR", "description": "development account"}' |
  sed -n 's/.*"id"[[:space:]]*:[[:space:]]*"\(acct_[^"]*\)".*/\1/p'); echo "account: \$ACCOUNT"

# Fund it with 100.00 EUR (amounts are in minor units).
pay -X POST "\$BASE/v1/accounts/\$ACCOUNT/deposits" -H 'Idempotency-Key: dev-deposit-$run_id' \\
  -d '{"amount": 10000}'

# Charge 25.00 EUR, then send the very same request again: the second answer is the
# stored first one (Idempotent-Replayed: true), and the money moves once.
charge() { pay -i -X POST "\$BASE/v1/charges" -H 'Idempotency-Key: dev-charge-$run_id' \\
  -d "{\"account_id\": \"\$ACCOUNT\", \"amount\": 2500, \"currency\": \"EUR\"}"; }
charge
charge

# The balance is 7500: charged once.
pay "\$BASE/v1/accounts/\$ACCOUNT"
SESSION
)
mkdir -p bin
printf '%s\n' "$session" >bin/dev-session.sh

cat <<EOF

==================================================================================
$session
==================================================================================
(also saved as bin/dev-session.sh: bash bin/dev-session.sh)

EOF
if [ "$METRICS_ADDR" = off ]; then
	say "metrics: off (METRICS_ADDR=off)"
else
	mhost=${METRICS_ADDR%:*}
	case $mhost in "" | 0.0.0.0 | "[::]" | "::") mhost=localhost ;; esac
	say "metrics: http://$mhost:${METRICS_ADDR##*:}/metrics (METRICS_ADDR; not on the API port)"
fi
say "starting: payments serve on $HTTP_ADDR (Ctrl-C stops it)"
exec bin/payments serve
