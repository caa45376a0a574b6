#!/usr/bin/env bash
# Fails when the configuration table of docs/operations.md (between its
# settings markers) differs from what the settings in cmd/payments/rooms.go
# produce, and says to run make settings, which rewrites it. make lint runs it.
#
# The table is rendered by a Go test (cmd/payments/settingstable_test.go) from
# the rooms and commands that -h prints. Like every test of cmd/payments it
# starts with a PostgreSQL (internal/pgtest), though it uses none.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
if ! out=$("$GO" test -count=1 -run '^TestSettingsTableIsCurrent$' ./cmd/payments/ 2>&1); then
	echo "$out" >&2
	echo "lint-settings: the configuration table of docs/operations.md is not what cmd/payments/rooms.go says; run: make settings" >&2
	exit 1
fi
echo "lint-settings: the configuration table of docs/operations.md matches the settings"
