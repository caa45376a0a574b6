# payments: build, run and test the payment-charging service.
# `make` (or `make help`) lists the targets.

GO        ?= go
BIN       := bin/payments
# Extra flags for go test, e.g. make test TESTFLAGS='-run TestCharge'.
TESTFLAGS ?=

# What `payments version` and the payments_build_info metric report, linked
# into bin/payments (cmd/payments/version.go). Set on the command line to
# override: make build VERSION=v1.2.0. Expanded when build runs, not when make
# reads this file.
VERSION    = $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT     = $(shell git rev-parse HEAD 2>/dev/null)
BUILD_TIME = $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS    = -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildTime=$(BUILD_TIME)

.DEFAULT_GOAL := help
.PHONY: help build run test lint tidy clean

help: ## List the targets
	@echo 'Usage: make <target>'
	@echo
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

build: ## Build the service binary into bin/payments, its version and commit linked in (bin/payments version)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/payments

run: ## Start PostgreSQL (Docker Compose or local), migrate, print a curl session and serve
	./scripts/run.sh

# scripts/test.sh runs go test -race -v over every package, then prints a
# summary: each package's result, the PostgreSQL each used, and every skipped
# test with its reason. make fails exactly when go test does.
test: ## Run every test, integration tests included, under the race detector
	GO=$(GO) ./scripts/test.sh $(TESTFLAGS)

.PHONY: profile
profile: ## CPU profile of the service under the fresh-charge load (PROFILE_SECONDS=15); prints the top costs
	GO=$(GO) ./scripts/profile.sh

# The benchmarks, the load generator and the HA cluster runner are the lab's
# (lab/, a module of its own: lab/cmd/benchrun, paymentsbench, hacluster,
# benchplot, dockerlint); they drive bin/payments and the Go client, and the
# scripts build them into bin/.
#
# make bench: fresh charges, replays, a storm on one key, the janitor, a large
# key table and the heap against the database's own ceiling (pg-reference);
# group commit against the service before it (BENCH_BASELINE, default
# ac4142a, built from git into bin/payments-baseline) with the throughput
# curve drawn by lab/cmd/benchplot into docs/bench-throughput.png and
# docs/bench-p99.png; CPU per charge by part, the relay on and off
# (bench-pair). About 22 minutes with the defaults (it took 1,344 s on
# 2026-12-01); the knobs (BENCH_SECONDS, BENCH_PAIRS, BENCH_CURVE=0,
# BENCH_LARGE=0, BENCH_CPU=0, BENCH_REPORT, ...) are listed in
# lab/cmd/benchrun/bench.go, which runs it (scripts/bench.sh builds it).
.PHONY: bench
bench: ## Load-test scratch services (before/after group commit) against pg-reference; writes docs/benchmarks.md and its PNGs
	GO=$(GO) ./scripts/bench.sh

# make bench-pair: one change measured against the build before it (PAIR_A, a
# git rev, default HEAD~1; PAIR_B default the working tree), fresh charges with
# the relay on and off, alternating, pg-reference each round, and the CPU per
# charge of the machine, the service, PostgreSQL, nats-server and the load
# generator (paymentsbench -cpu). About 4 minutes; prints a table. make
# batch-cost: CPU per batch and per charge at each client count. Both are
# lab/cmd/benchrun's (`benchrun pair`, `benchrun batch-cost`), which their scripts
# build and run; the knobs are listed in lab/cmd/benchrun/pair.go and batchcost.go.
.PHONY: bench-pair
bench-pair: ## Paired fresh-charge bench of two builds (PAIR_A, PAIR_B), relay on and off, CPU per charge by part
	GO=$(GO) ./scripts/bench-pair.sh

.PHONY: batch-cost
batch-cost: ## What a charge batch costs apart from its charges: CPU per batch and per charge at 1, 4 and 16 clients (COST_CLIENTS)
	GO=$(GO) ./scripts/batch-cost.sh

# make http-floor: what an HTTP request costs this machine before any charge
# work: net/http, fasthttp and a bare HTTP/1.1 loop each answering a charge-shaped POST,
# saturated and held in groups as the service holds charges (lab/cmd/httpfloor
# documents it). Starts no database; about 6 minutes (HTTP_FLOOR_ARGS, e.g.
# "-rounds 1 -seconds 3" for a quick look).
.PHONY: http-floor
http-floor: ## CPU per request of net/http, fasthttp and a bare HTTP/1.1 loop under the charge load's shape, no charge work (HTTP_FLOOR_ARGS)
	$(GO) -C lab build -o ../bin/httpfloor ./cmd/httpfloor
	bin/httpfloor $(HTTP_FLOOR_ARGS)

# make bench-processor: card charges at the card processor simulator
# (bin/procsim) against account charges, one service in one run, 256 clients:
# the simulator answering at once (pm_card_approve) and after 50 ms
# (pm_card_slow, -slow-delay 50ms), alternating with the fresh account
# charges, pg-reference each round; charges/s, the service's CPU per charge,
# its connection pool in use. About 3 minutes; it rewrites only its own
# section of docs/benchmarks.md (make bench runs it too, BENCH_PROCESSOR=0
# skips it there). The work is lab/cmd/benchrun's (`benchrun processor`),
# which scripts/bench-processor.sh builds and runs; the knobs (PROC_ROUNDS,
# PROC_SECONDS, PROC_CLIENTS, PROC_SLOW_DELAY, ...) are listed in
# lab/cmd/benchrun/proc.go.
.PHONY: bench-processor
bench-processor: ## Card charges at the processor simulator (answering at once, after 50 ms) vs account charges, 256 clients; writes its section of docs/benchmarks.md
	GO=$(GO) ./scripts/bench-processor.sh

# make bench-isolation: does one merchant slow another? Merchant B's charges
# alone and while 96 clients of merchant A read at full speed, with the
# per-merchant budgets (RATE_LIMIT_READS, RATE_LIMIT_WRITES) as shipped and
# off, then 200,000 of A's holds expiring at once while B's events are
# timed. About 3 minutes; lab/cmd/benchrun/isolation.go lists the knobs
# (ISO_SECONDS, ISO_ROUNDS, ISO_READERS, ISO_HOLDS, BENCH_REPORT).
.PHONY: bench-isolation
bench-isolation: ## One merchant's 96 full-speed readers and 200,000 expiring holds against another's charges; writes its section of docs/benchmarks.md
	GO=$(GO) ./scripts/bench-isolation.sh

# make bench-sync: the cost of synchronous replication. Starts the
# HA cluster if needed (and leaves it running), then compares fresh charges on
# it (sync standby; then synchronous_commit=local) with the single server on
# :5432, in interleaved rounds, each paired with pg-reference. About 20 minutes
# with the defaults; it rewrites only its own section of docs/benchmarks.md.
# The work is lab/cmd/benchrun's (`benchrun sync`), which scripts/bench-sync.sh
# builds and runs; the knobs (BENCH_SECONDS, BENCH_SYNC_ROUNDS,
# BENCH_SYNC_CLIENTS) are listed in lab/cmd/benchrun/sync.go.
.PHONY: bench-sync
bench-sync: ## Fresh charges with a synchronous standby vs a single server, against pg-reference; writes its section of docs/benchmarks.md
	GO=$(GO) ./scripts/bench-sync.sh

# The fault scenarios of internal/chaos in their long form (make test runs the
# short one): SIGKILLs under load, lost commit acknowledgements, database
# outages, replicas racing one key, hostile input. Each scenario bounds itself
# in time. Every scenario prints a "chaos-summary:" line, a row of the table in
# docs/reliability.md.
# The failover scenarios (TestFailover*) need the HA cluster: make chaos runs
# them when make ha-up has started it, and says it skipped them otherwise;
# make chaos-ha starts it and runs only them (CHAOS_LONG=1 for the long form).
# HA_PG_PORT, HA_PATRONI_PORT and HA_ETCD_PORT move the cluster's ports
# (default 5441, 8441, 23790; lab/README.md), HA_DIR its data: a second
# cluster runs beside the first with all four set, e.g. `make chaos-ha
# HA_DIR=/var/tmp/payments-ha2 HA_PG_PORT=5451 HA_PATRONI_PORT=8451
# HA_ETCD_PORT=23890`. HA_PORTS passes the ports on to $(shell), which make
# 4.3 runs without the variables set on its command line.
HA_PORTS = HA_PG_PORT='$(HA_PG_PORT)' HA_PATRONI_PORT='$(HA_PATRONI_PORT)' HA_ETCD_PORT='$(HA_ETCD_PORT)'
# HA_ENV is expanded while make reads a recipe: `ha.sh url` and `ha.sh api`
# build bin/hacluster if needed and print what the ports make of the URL
# and of the members' REST APIs; silent when that fails.
HA_ENV = PAYMENTS_HA_URL='$(shell $(HA_PORTS) GO=$(GO) ./scripts/ha.sh url 2>/dev/null)' \
	PAYMENTS_HA_PATRONI='$(shell $(HA_PORTS) GO=$(GO) ./scripts/ha.sh api 2>/dev/null)'

.PHONY: chaos chaos-ha
chaos: ## Run the long fault-injection scenarios (CHAOS_LONG=1 ./internal/chaos, a few minutes; failover too after make ha-up)
	if GO=$(GO) HA_WAIT=2 ./scripts/ha.sh wait >/dev/null 2>&1; then export $(HA_ENV); fi; \
	CHAOS_LONG=1 $(GO) test -race -count=1 -v -timeout 45m ./internal/chaos/

HA_RUN ?= ^TestFailover

chaos-ha: ## Start the HA cluster if needed and run the failover scenarios against it (kills its members; HA_RUN picks them)
	GO=$(GO) ./scripts/ha.sh up >/dev/null
	$(HA_ENV) $(GO) test -race -count=1 -v -timeout 30m -run '$(HA_RUN)' ./internal/chaos/

# A PostgreSQL HA cluster on this machine for development and the failover
# tests: etcd and three Patroni members (deploy/ha) on 127.0.0.1:5441, :5442
# and :5443 (HA_PG_PORT and its kin above move them), a primary, a synchronous standby and a replica that becomes
# synchronous when the standby goes, so losing any one member keeps writes
# going; data and logs in HA_DIR (default /var/tmp/payments-ha). ha-up is idempotent and prints the DATABASE_URL;
# scripts/ha.sh has the helpers the tests use (primary, pid, ctl, ...). It
# builds and runs lab/cmd/hacluster, which does the work (go doc ./lab/cmd/hacluster).
.PHONY: ha-up ha-down ha-status
ha-up: ## Start the HA cluster (etcd, Patroni primary + sync standby + replica) and print its DATABASE_URL
	GO=$(GO) ./scripts/ha.sh up

ha-down: ## Stop the HA cluster and delete its data (HA_DIR)
	GO=$(GO) ./scripts/ha.sh down

ha-status: ## Show the HA cluster's processes and members (patronictl list)
	GO=$(GO) ./scripts/ha.sh status

# How long make fuzz runs each target. A failing input is saved under the
# package's testdata/fuzz/<target>/, where go test then replays it.
FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s): canonical JSON, key parsing, request decoding
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalize$$' -fuzztime $(FUZZTIME) ./internal/idempotency/
	$(GO) test -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME) ./internal/idempotency/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/httpapi/
	$(GO) test -run '^$$' -fuzz '^FuzzReadPost$$' -fuzztime $(FUZZTIME) ./internal/httpapi/

# Mutation testing with gremlins (pinned, built from the module proxy on first
# use): one operator changed at a time in internal/idempotency,
# internal/postgres, internal/httpapi and internal/relay, the four packages'
# tests run against each change in a scratch copy of the checkout. It takes
# hours, so make test does not run it. MUTANTS_PKGS narrows it to some of the
# four (make mutants MUTANTS_PKGS=internal/idempotency). The score and the
# reason each survivor is left are in docs/reliability.md.
MUTANTS_PKGS ?=

.PHONY: mutants
mutants: ## Mutation-test the core packages with gremlins (slow, hours); results in mutants/
	GO=$(GO) ./scripts/mutants.sh $(MUTANTS_PKGS)

# golangci-lint is pinned and built from the Go module proxy on first use
# (about two minutes), then comes from the build cache.
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

lint: ## Check formatting, go vet, golangci-lint (.golangci.yaml), the OpenAPI spec (redocly), the alerting rules (promtool), the metric names in rules and dashboard and the configuration table (need PostgreSQL), script sizes, the package map and the charge walk (both in docs/architecture.md), the docs' links and the README's layout
	@unformatted=$$(gofmt -l .) || exit 1; \
	if [ -n "$$unformatted" ]; then \
		echo 'gofmt: these files need formatting (gofmt -w):'; echo "$$unformatted"; exit 1; \
	fi
	$(GO) vet ./...
	cd client && $(GO) vet ./...
	cd lab && $(GO) vet ./...
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...
	cd client && $(GOLANGCI_LINT) run --allow-parallel-runners ./...
	cd lab && $(GOLANGCI_LINT) run --allow-parallel-runners ./...
	bash scripts/lint-openapi.sh
	bash scripts/lint-alerts.sh
	GO=$(GO) bash scripts/lint-metric-names.sh
	bash scripts/lint-sizes.sh
	GO=$(GO) bash scripts/lint-architecture.sh
	GO=$(GO) bash scripts/charge-walk.sh check
	$(GO) test -count=1 -run '^(TestDocsLinks|TestReadmeLayout)$$' .
	GO=$(GO) bash scripts/lint-settings.sh

# docs/operations.md's configuration table is rendered from the settings of
# cmd/payments (rooms.go: each room's settings, and the commands that read
# them) by a test, which -update-settings lets rewrite it; make lint fails
# while it differs (scripts/lint-settings.sh).
.PHONY: settings
settings: ## Rewrite the configuration table of docs/operations.md from the settings (cmd/payments/rooms.go)
	$(GO) test -count=1 -run '^TestSettingsTableIsCurrent$$' ./cmd/payments/ -update-settings

# make charge-walk: TestChargeWalk (internal/e2e, -tags chargewalk) builds
# internal/e2e/testdata/chargewalk with coverage, makes one fresh charge
# through the service wired in process, and writes the functions of the
# module that charge ran into the marked block of docs/architecture.md;
# make lint fails when that block differs (scripts/charge-walk.sh check).
.PHONY: charge-walk
charge-walk: ## Count the functions of the module one fresh charge runs (coverage counters) and write them into docs/architecture.md
	GO=$(GO) bash scripts/charge-walk.sh write

# client/types.gen.go holds the request and response types of openapi.yaml,
# generated by oapi-codegen (pinned in client/doc.go's go:generate line);
# scripts/check-generate.sh, run by CI, fails when the checked-in file is stale.
.PHONY: generate
generate: ## Regenerate client/types.gen.go from openapi.yaml (oapi-codegen)
	cd client && $(GO) generate ./...

# Needs no Docker engine. Without the Compose plugin the compose check is
# skipped with a warning (under CI=true it fails); scripts/install-compose.sh
# builds the plugin. Kept out of lint, which needs neither.
.PHONY: lint-docker
lint-docker: ## Check docker-compose.yml (docker compose config) and lint the Dockerfile (lab/cmd/dockerlint)
	GO=$(GO) bash scripts/lint-docker.sh

# The image docker-compose.yml runs (payments:dev), with what make build links
# in passed as build arguments: the build context has no .git (.dockerignore).
.PHONY: image
image: ## Build the container image payments:dev with its version, commit and build time (docker build)
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --build-arg BUILD_TIME=$(BUILD_TIME) -t payments:dev .

tidy: ## Tidy go.mod and go.sum
	$(GO) mod tidy

clean: ## Remove build output and coverage files
	rm -rf bin/ coverage.out coverage.html
