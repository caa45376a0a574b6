#!/usr/bin/env bash
# bench.sh: `make bench`. Measures the service against the database's own
# ceiling (fresh charges, replays, a storm on one key, the janitor, a large
# key table, the heap), group commit against its baseline, CPU per charge by
# part with the relay on and off, and writes docs/benchmarks.md (BENCH_REPORT
# writes it elsewhere).
#
# The orchestration is Go, lab/cmd/benchrun (bench.go lists every BENCH_*
# setting: BENCH_SECONDS, BENCH_CLIENTS, BENCH_PAIRS, BENCH_LARGE=0,
# BENCH_CURVE=0, BENCH_CPU=0, ...); this builds it and runs it from the
# repository's root. It stops what it starts and drops its scratch
# databases, interrupted or not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
mkdir -p bin
"$GO" -C lab build -o ../bin/benchrun ./cmd/benchrun
GO=$GO exec bin/benchrun bench
