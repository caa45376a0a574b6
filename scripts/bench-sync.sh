#!/usr/bin/env bash
# bench-sync.sh: the cost of synchronous replication, written into its own
# section of docs/benchmarks.md (`make bench-sync` calls it). The work is
# lab/cmd/benchrun's (`benchrun sync`, lab/cmd/benchrun/sync.go, which documents it):
# this builds bin/benchrun and runs it from the repository's root.
#
# Environment (read by benchrun sync):
#   BENCH_SECONDS        seconds per run, service and pg-reference (default 10)
#   BENCH_SYNC_ROUNDS    rounds (default 6)
#   BENCH_SYNC_CLIENTS   client counts (default "16 1")
#   BENCH_REPORT         the file whose section is rewritten (default docs/benchmarks.md)
#   PAYMENTS_BENCH_DATABASE_URL: the single server, where this may CREATE DATABASE
#     (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
#   GO                   the go command (default go)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
export GO
mkdir -p bin
"$GO" -C lab build -o ../bin/benchrun ./cmd/benchrun
exec bin/benchrun sync
