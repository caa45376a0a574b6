#!/usr/bin/env bash
# bench-processor.sh: card charges at the processor against account charges,
# in one run (make bench-processor): the card processor simulator answering
# at once and after 50 ms, 256 clients, the service's CPU per charge and its
# connection pool; rewrites only its own section of docs/benchmarks.md.
#
#   PROC_ROUNDS=3 PROC_SECONDS=10 scripts/bench-processor.sh
#
# The work is lab/cmd/benchrun's (`benchrun processor`,
# lab/cmd/benchrun/proc.go, which documents it and lists its knobs:
# PROC_ROUNDS, PROC_SECONDS, PROC_CLIENTS, PROC_SLOW_DELAY, PROC_OUT,
# BENCH_REPORT, ...): this builds bin/benchrun and runs it from the
# repository's root. It stops what it starts and drops its databases,
# interrupted or not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
export GO
mkdir -p bin
"$GO" -C lab build -o ../bin/benchrun ./cmd/benchrun
exec bin/benchrun processor
