#!/usr/bin/env bash
# Lints openapi.yaml with Redocly CLI: the recommended rules, configured in
# redocly.yaml. Exits non-zero on any error; warnings are printed.
#
# Needs Node.js 20.19+ or 22.12+ with npm. npx fetches the pinned CLI from the npm
# registry on first use and caches it. Extra arguments go to `redocly lint`, for
# example --format=stylish.
set -euo pipefail

# Pinned so that CI and every developer lint with the same rules. To upgrade,
# change it here and fix whatever the new version reports.
REDOCLY_CLI_VERSION=2.77.0

cd "$(dirname "$0")/.."
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true
exec npx --yes "@redocly/cli@${REDOCLY_CLI_VERSION}" lint --config redocly.yaml "$@" openapi.yaml
