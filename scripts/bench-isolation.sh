#!/usr/bin/env bash
# bench-isolation.sh: does one merchant slow another? (make bench-isolation):
# merchant B's charges alone and while 96 clients of merchant A read at full
# speed, with the per-merchant budgets as shipped and without them, then
# 200,000 of A's holds expiring at once while B's events are timed; rewrites
# only its own section of docs/benchmarks.md.
#
#   ISO_ROUNDS=2 ISO_SECONDS=10 scripts/bench-isolation.sh
#
# The work is lab/cmd/benchrun's (`benchrun isolation`,
# lab/cmd/benchrun/isolation.go, which documents it and lists its knobs):
# this builds bin/benchrun and runs it from the repository's root. It stops
# what it starts and drops its databases, interrupted or not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
export GO
mkdir -p bin
"$GO" -C lab build -o ../bin/benchrun ./cmd/benchrun
exec bin/benchrun isolation
