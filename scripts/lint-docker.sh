#!/usr/bin/env bash
# lint-docker.sh: check docker-compose.yml with `docker compose config` and lint
# the Dockerfile with lab/cmd/dockerlint (BuildKit's parser and build checks, plus
# this project's rules: pinned base images, a non-root USER, EXPOSE 8080, an
# exec-form ENTRYPOINT, no ADD of URLs, nothing COPYed that .dockerignore drops).
# Neither needs a Docker engine. `make lint-docker` runs it.
#
# Without the Compose plugin the compose check is skipped with a warning, unless
# CI=true: there a missing tool fails (CI installs it: scripts/install-compose.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}

say() { printf 'lint-docker: %s\n' "$*" >&2; }

if docker compose version >/dev/null 2>&1; then
	# Every variable the file reads, unset and set, must give a valid project.
	docker compose config --quiet
	HTTP_PORT=18080 POSTGRES_PORT=15432 NATS_PORT=14222 docker compose config --quiet
	say "docker-compose.yml: ok (docker compose $(docker compose version --short))"
elif [ "${CI:-}" = true ]; then
	say "docker compose does not answer; under CI that is a failure: run scripts/install-compose.sh first"
	exit 1
else
	say "WARNING: SKIPPED the docker-compose.yml check: 'docker compose version' fails."
	say "WARNING: install the plugin (bash scripts/install-compose.sh, or Docker Compose v2) to run it."
fi

# lab/cmd/dockerlint lives in the lab's module (lab/go.mod), so that the
# service's go.mod does not carry BuildKit. Its tests are quick and run first
# (make lint and make test cover it too, with the rest of the lab).
"$GO" -C lab vet ./cmd/dockerlint
"$GO" -C lab test -count=1 ./cmd/dockerlint
"$GO" -C lab run ./cmd/dockerlint -expose 8080 -context .. ../Dockerfile
