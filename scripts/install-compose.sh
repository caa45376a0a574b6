#!/usr/bin/env bash
# install-compose.sh: make `docker compose` answer, for `make lint-docker` (and
# CI, which runs it). When no Compose plugin answers, builds Docker Compose
# v2.40.3 from the Go module proxy into ~/.docker/cli-plugins/docker-compose
# (about six minutes the first time; `go install` refuses the module because of
# its exclude directives). When one answers, whichever version, it does nothing.
# Needs Go and the docker CLI (the client only; no engine).
set -euo pipefail

# Pinned so that every machine checks docker-compose.yml with the same rules.
COMPOSE_VERSION=v2.40.3

say() { printf 'install-compose: %s\n' "$*" >&2; }

command -v docker >/dev/null 2>&1 || {
	say "the docker CLI is not installed: install it (the client is enough: docker-ce-cli, or Docker Desktop)"
	exit 1
}
if have=$(docker compose version --short 2>/dev/null); then
	say "docker compose $have is installed"
	exit 0
fi

plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
say "docker compose does not answer: building $COMPOSE_VERSION from the Go module proxy into $plugins (about 6 minutes)"
go mod download "github.com/docker/compose/v2@$COMPOSE_VERSION"
src="$(go env GOMODCACHE)/github.com/docker/compose/v2@$COMPOSE_VERSION"
mkdir -p "$plugins"
(cd "$src" && go build -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
	-o "$plugins/docker-compose.tmp" ./cmd)
mv "$plugins/docker-compose.tmp" "$plugins/docker-compose"
docker compose version
