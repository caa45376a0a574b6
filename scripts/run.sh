#!/usr/bin/env bash
# run.sh: start payments on this machine for development (`make run` calls it).
#
#  1. PostgreSQL: with DATABASE_URL set, that server; else, when a Docker engine
#     answers, the postgres and nats services of docker-compose.yml (nats not when
#     NATS_URL is set): a service of the stack that runs already is used where it
#     runs, whatever its port; one that does not is started on POSTGRES_PORT or
#     NATS_PORT, read as docker compose reads them (the environment, else .env),
#     and a port that is already taken is reported with the one variable that
#     moves it. Else a PostgreSQL on localhost:5432
#     (user postgres, no password; migrate creates database payments) and
#     whatever NATS answers on NATS_URL, default localhost:4222 (the relay waits
#     for one, events stay in the outbox meanwhile).
#  2. Builds bin/payments (make build), migrates, creates a development merchant.
#  3. Starts the card processor simulator (bin/procsim, docs/processors.md) on
#     PROCSIM_ADDR, its state in a database of its own (procsim) on the same
#     server, its webhooks signed with a fresh secret, and points the service
#     at it (PROCESSOR_URL, PROCESSOR_WEBHOOK_SECRET): test cards charge with
#     no account at any processor. It stops when make run stops. With
#     PROCESSOR=stripe (STRIPE_API_KEY, STRIPE_API_BASE...), Stripe instead.
#  4. Writes bin/dev.sh (the merchant's API key, the addresses, pay and ids:
#     scripts/dev.sh.tmpl), prints a curl session built on it, and serves on
#     HTTP_ADDR, with Prometheus metrics on METRICS_ADDR, webhook endpoints on
#     this machine allowed (WEBHOOK_ALLOW_PRIVATE_NETWORKS, default true here).
#
# Environment: DATABASE_URL, NATS_URL, HTTP_ADDR (default 127.0.0.1:8080),
# METRICS_ADDR (default 127.0.0.1:9464; off: none), PROCSIM_ADDR (default
# 127.0.0.1:8090), POSTGRES_PORT and NATS_PORT
# (host ports of the Compose postgres and nats, default 5432 and 4222; keep
# moved ones in .env, which docker compose reads too). A port make run needs
# that is taken fails it before anything starts, naming the variable to set;
# the hint keeps the variables already set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'run: %s\n' "$*" >&2; }
die() {
	printf 'run: %s\n' "$@" >&2
	exit 1
}
# port_open HOST PORT: whether something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
# The variables the caller set, kept in every hint so that following one does
# not undo another.
given=()
for var in DATABASE_URL NATS_URL HTTP_ADDR METRICS_ADDR PROCSIM_ADDR POSTGRES_PORT NATS_PORT; do
	[ -z "${!var:-}" ] || given+=("$var=${!var}")
done
# hint VAR=VALUE: the command to run again, with VAR=VALUE and what was given;
# or, when .env set VAR, the line to change there (docker compose reads it too).
hint() {
	local kept=() g var=${1%%=*}
	for g in "${given[@]}"; do [ "${g%%=*}" = "$var" ] || kept+=("$g"); done
	if [ -z "${!var:-}" ] && [ -f .env ] && grep -Eq "^[[:space:]]*$var[[:space:]]*=" .env; then
		echo "change the line $var= of .env to $1, then: ${kept[*]:+${kept[*]} }make run"
	else
		echo "${kept[*]:+${kept[*]} }$1 make run"
	fi
}
# compose_var VAR: VAR as docker compose reads it: the environment's, else the
# last VAR= line of .env (quotes dropped), else empty.
compose_var() {
	if [ -n "${!1:-}" ]; then
		printf '%s' "${!1}"
	elif [ -f .env ]; then
		sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*//p" .env | tail -n 1 | tr -d "\"'\r"
	fi
}
# port_variable SERVICE: the variable that moves the host port of a Compose service.
port_variable() {
	case $1 in
	postgres) echo POSTGRES_PORT ;;
	nats) echo NATS_PORT ;;
	esac
}
# container_port SERVICE: the port the service listens on in its container.
container_port() {
	case $1 in
	postgres) echo 5432 ;;
	nats) echo 4222 ;;
	esac
}
# published_port SERVICE: the host port docker compose publishes it on.
published_port() {
	local p
	p=$(compose_var "$(port_variable "$1")")
	echo "${p:-$(container_port "$1")}"
}
# running_port SERVICE: the host port of the stack's running SERVICE, or
# nothing when it does not run.
running_port() {
	local where
	where=$(docker compose port "$1" "$(container_port "$1")" 2>/dev/null | tail -n 1) || return 0
	[ -z "$where" ] || echo "${where##*:}"
}
# free_or_die PORT WHAT VAR=VALUE: stop at once when PORT is taken.
free_or_die() {
	if port_open 127.0.0.1 "$1"; then
		die "port $1 is taken ($2)." "Move it: $(hint "$3")"
	fi
}

command -v go >/dev/null 2>&1 ||
	die "Go is not installed (or not on PATH): install Go 1.26 or newer from https://go.dev/dl/ and run make run again."

# Loopback by default: a development server is not for the network.
export HTTP_ADDR=${HTTP_ADDR:-127.0.0.1:8080}
# A development server may deliver webhooks to a receiver on this machine
# (docs/webhooks.md); serve logs a WARN saying so.
export WEBHOOK_ALLOW_PRIVATE_NETWORKS=${WEBHOOK_ALLOW_PRIVATE_NETWORKS:-true}
export METRICS_ADDR=${METRICS_ADDR:-127.0.0.1:9464}
# The server's own ports first, so that a clash (the stack's payments service
# holds 8080 and 9464) stops make run before it starts or prints anything.
http_port=${HTTP_ADDR##*:}
free_or_die "$http_port" "HTTP_ADDR=$HTTP_ADDR; the Compose payments service, say: docker compose ps" \
	"HTTP_ADDR=127.0.0.1:$((http_port + 1))"
if [ "$METRICS_ADDR" != off ]; then
	metrics_port=${METRICS_ADDR##*:}
	free_or_die "$metrics_port" "METRICS_ADDR=$METRICS_ADDR; another payments serve, say" \
		"METRICS_ADDR=127.0.0.1:$((metrics_port + 1))"
fi
export PROCSIM_ADDR=${PROCSIM_ADDR:-127.0.0.1:8090}
procsim_port=${PROCSIM_ADDR##*:}
[ "${PROCESSOR:-}" = stripe ] || free_or_die "$procsim_port" "PROCSIM_ADDR=$PROCSIM_ADDR; another make run's simulator, say" \
	"PROCSIM_ADDR=127.0.0.1:$((procsim_port + 1))"

# --- 1. PostgreSQL ---------------------------------------------------------------
if [ -n "${DATABASE_URL:-}" ]; then
	say "using the PostgreSQL in DATABASE_URL"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
	docker compose version >/dev/null 2>&1 ||
		die "Docker answers, but the Compose plugin is missing ('docker compose version' fails)." \
			"Install Docker Compose v2 (https://docs.docker.com/compose/install/), or set DATABASE_URL to a PostgreSQL of your own."
	services=(postgres)
	if [ -n "${NATS_URL:-}" ]; then
		say "using the NATS in NATS_URL"
	else
		services+=(nats)
	fi
	# A service of the stack that runs is used where it runs: docker compose up
	# would recreate it on the port the variables say now, stopping it. One
	# that does not run is started, after checking its port, since a port taken
	# by something else makes docker compose fail with a message about the port
	# alone and the container left stopped.
	to_start=()
	for service in "${services[@]}"; do
		want=$(published_port "$service")
		port=$(running_port "$service")
		if [ -z "$port" ]; then
			free_or_die "$want" "another $service, say; docker compose would publish $service there" \
				"$(port_variable "$service")=$((want + 1))"
			port=$want
			to_start+=("$service")
			export "$(port_variable "$service")=$want"
		elif [ "$port" != "$want" ]; then
			say "the stack's $service runs on port $port, not $want: using it there (put $(port_variable "$service")=$port in .env to keep it)"
		fi
		case $service in
		postgres) pg_port=$port ;;
		nats) export NATS_URL="nats://127.0.0.1:$port" ;;
		esac
	done
	where="PostgreSQL on localhost:$pg_port"
	[ "${#services[@]}" -eq 1 ] || where="$where, NATS on ${NATS_URL#nats://}"
	if [ "${#to_start[@]}" -eq 0 ]; then
		say "Docker engine found: the Compose stack runs already ($where)"
	else
		say "Docker engine found: starting ${to_start[*]} with docker compose ($where)"
		docker compose up -d --wait "${to_start[@]}" >&2 ||
			die "docker compose could not start ${to_start[*]} (see above; 'docker compose ps -a' and 'docker compose logs' say more)."
	fi
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

host=${HTTP_ADDR%:*}
port=${HTTP_ADDR##*:}
case $host in "" | 0.0.0.0 | "[::]" | "::") host=localhost ;; esac
base="http://$host:$port"
run_id=$(date +%s)

# --- 3. The card processor simulator (or Stripe: PROCESSOR=stripe) --------------------
card_pm=pm_card_approve
if [ "${PROCESSOR:-}" = stripe ]; then
	[ -n "${STRIPE_API_KEY:-}" ] || die "PROCESSOR=stripe needs STRIPE_API_KEY (a test key, sk_test_...; any one for stripe-mock)"
	export PROCESSOR_URL="" PROCSIM_DATABASE_URL="" && card_pm=pm_card_visa
	say "card charges go to Stripe at ${STRIPE_API_BASE:-https://api.stripe.com} (no simulator)"
else
	say "building bin/procsim and starting the card processor simulator on $PROCSIM_ADDR"
	"${GO:-go}" build -o bin/procsim ./cmd/procsim
	# Its own database on the same server: DATABASE_URL with the database procsim.
	db_query=""
	case $DATABASE_URL in *\?*) db_query="?${DATABASE_URL#*\?}" ;; esac
	db_base=${DATABASE_URL%%\?*}
	export PROCSIM_DATABASE_URL="${db_base%/*}/procsim$db_query"
	secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	export PROCSIM_WEBHOOK_URL="$base/v1/processor/events" PROCSIM_WEBHOOK_SECRET="$secret"
	export PROCESSOR_URL="http://$PROCSIM_ADDR" PROCESSOR_WEBHOOK_SECRET="$secret"
	bin/procsim serve >bin/procsim.log 2>&1 &
	procsim_pid=$!
	trap 'kill "$procsim_pid" 2>/dev/null || true' EXIT
	for _ in $(seq 1 100); do
		grep -q "listening on" bin/procsim.log 2>/dev/null && break
		kill -0 "$procsim_pid" 2>/dev/null || die "the simulator did not start (bin/procsim.log):" "$(tail -n 20 bin/procsim.log)"
		sleep 0.1
	done
	grep -q "listening on" bin/procsim.log ||
		die "the simulator does not listen after 10 s (bin/procsim.log):" "$(tail -n 20 bin/procsim.log)"
fi

# --- 4. The curl session, then serve -------------------------------------------------

# bin/dev.sh: the key, the addresses and two shell functions, for the sessions
# of README.md and docs/ (sourced) and for the one printed below (inlined).
mkdir -p bin
sed -e "s|@API_KEY@|$api_key|" -e "s|@BASE@|$base|" -e "s|@DATABASE_URL@|$DATABASE_URL|" \
	-e "s|@NATS_URL@|${NATS_URL:-nats://127.0.0.1:4222}|" -e "s|@PROCESSOR_URL@|$PROCESSOR_URL|" \
	-e "s|@PROCSIM_DATABASE_URL@|$PROCSIM_DATABASE_URL|" scripts/dev.sh.tmpl >bin/dev.sh
session=$(
	cat bin/dev.sh
	cat <<SESSION

# Open an account; every POST carries an Idempotency-Key.
ACCOUNT=\$(pay -X POST "\$BASE/v1/accounts" -H 'Idempotency-Key: dev-account-$run_id' \\
  -d '{"currency": "EUR", "description": "development account"}' | ids acct); echo "account: \$ACCOUNT"

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

# Charge 12.00 EUR to a test card at the card processor (the simulator make run
# started, or Stripe), twice with one key: the second answer is the stored first
# one, and the processor charged the card once (bin/procsim audit says so).
card() { pay -i -X POST "\$BASE/v1/charges" -H 'Idempotency-Key: dev-card-$run_id' \\
  -d '{"payment_method": "$card_pm", "amount": 1200, "currency": "EUR"}'; }
card
card
SESSION
)
printf '%s\n' "$session" >bin/dev-session.sh

cat <<EOF

==================================================================================
$session
==================================================================================
(also saved as bin/dev-session.sh: bash bin/dev-session.sh. In another shell,
. bin/dev.sh gives you API_KEY, BASE, pay and ids for the sessions of README.md
and docs/.)

EOF
if [ "$METRICS_ADDR" = off ]; then
	say "metrics: off (METRICS_ADDR=off)"
else
	mhost=${METRICS_ADDR%:*}
	case $mhost in "" | 0.0.0.0 | "[::]" | "::") mhost=localhost ;; esac
	say "metrics: http://$mhost:${METRICS_ADDR##*:}/metrics (METRICS_ADDR; not on the API port)"
fi
[ -z "$PROCESSOR_URL" ] || say "the card processor simulator: $PROCESSOR_URL (its log: bin/procsim.log; what it did: bin/procsim audit)"
say "starting: payments serve on $HTTP_ADDR (Ctrl-C stops it after SHUTDOWN_DELAY, 5s by default; twice, at once)"
# Not exec: the EXIT trap stops the simulator once the service has stopped.
bin/payments serve
