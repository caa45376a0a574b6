#!/usr/bin/env bash
# batch-cost.sh: what a charge batch costs, apart from what each charge in it
# adds (make batch-cost). The work is lab/cmd/benchrun's
# (`benchrun batch-cost`, lab/cmd/benchrun/batchcost.go, which documents it):
# this builds bin/benchrun and runs it from the repository's root. It prints
# a table on stdout, a row per client count. It stops what it starts and
# drops its databases, interrupted or not.
#
# Environment (read by benchrun batch-cost):
#   COST_CLIENTS         client counts (default "1 4 16")
#   COST_SECONDS         seconds per run (default 10)
#   COST_ACCOUNTS        accounts (default 1000)
#   COST_RELAY           off (default) or on
#   NATS_URL             the relay's NATS (default nats://127.0.0.1:4222)
#   PAYMENTS_TEST_DATABASE_URL  a PostgreSQL where this may CREATE DATABASE
#   GO                   the go command (default go)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
export GO
mkdir -p bin
"$GO" -C lab build -o ../bin/benchrun ./cmd/benchrun
exec bin/benchrun batch-cost
