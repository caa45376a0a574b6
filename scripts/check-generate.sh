#!/usr/bin/env bash
# check-generate.sh: fails when client/types.gen.go is not what make generate
# would write from the current openapi.yaml, so the spec, the server and the
# client cannot drift apart. Generates into a temporary directory; the working
# tree is left alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../client"
GO=${GO:-go}

# The generator command is read from the go:generate line, so the pinned
# version is written down once.
cmd=$(sed -n 's|^//go:generate go run \(.*\)$|\1|p' doc.go)
[ -n "$cmd" ] || { echo 'check-generate: no go:generate line in client/doc.go' >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086 # $cmd is a command line to split into words
"$GO" run ${cmd/-o types.gen.go/-o $tmp/types.gen.go}
if ! diff -u types.gen.go "$tmp/types.gen.go"; then
	echo 'check-generate: client/types.gen.go is stale; run make generate and commit it' >&2
	exit 1
fi
echo 'check-generate: client/types.gen.go is up to date'
