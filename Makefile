# payments: build, run and test the payment-charging service.
# `make` (or `make help`) lists the targets.

GO        ?= go
BIN       := bin/payments
# Extra flags for go test, e.g. make test TESTFLAGS='-run TestCharge'.
TESTFLAGS ?=

.DEFAULT_GOAL := help
.PHONY: help build run test lint tidy clean

help: ## List the targets
	@echo 'Usage: make <target>'
	@echo
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-7s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

build: ## Build the service binary into bin/payments
	$(GO) build -o $(BIN) ./cmd/payments

run: ## Start PostgreSQL (Docker Compose or local), migrate, print a curl session and serve
	./scripts/run.sh

# -v prints each package's "pgtest: ..." line naming the PostgreSQL it used.
# Nothing is piped, so make fails exactly when go test does.
test: ## Run every test, integration tests included, under the race detector
	$(GO) test -race -count=1 -v $(TESTFLAGS) ./...

.PHONY: bench
bench: ## Load-test a scratch service against pg-reference; writes docs/benchmarks.md (BENCH_SECONDS=10)
	GO=$(GO) ./scripts/bench.sh

lint: ## Check formatting, go vet, golangci-lint (if installed) and the OpenAPI spec
	@unformatted=$$(gofmt -l .) || exit 1; \
	if [ -n "$$unformatted" ]; then \
		echo 'gofmt: these files need formatting (gofmt -w):'; echo "$$unformatted"; exit 1; \
	fi
	$(GO) vet ./...
	@# golangci-lint reads its checked-in configuration (.golangci.yaml).
	@if command -v golangci-lint >/dev/null 2>&1; then \
		echo 'golangci-lint run ./...'; golangci-lint run ./...; \
	else \
		echo 'lint: golangci-lint not installed, skipped (see https://golangci-lint.run/welcome/install/)'; \
	fi
	@if [ -f scripts/lint-openapi.sh ]; then \
		echo 'scripts/lint-openapi.sh'; bash scripts/lint-openapi.sh; \
	fi

tidy: ## Tidy go.mod and go.sum
	$(GO) mod tidy

clean: ## Remove build output and coverage files
	rm -rf bin/ coverage.out coverage.html
