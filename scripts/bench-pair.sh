#!/usr/bin/env bash
# bench-pair.sh: fresh charges of two builds of the service, paired in one
# run (make bench-pair: one change measured at a time, the relay on and off,
# CPU per charge by part).
#
#   PAIR_A=<git rev> PAIR_B=<git rev> scripts/bench-pair.sh
#
# The work is lab/cmd/benchrun's (`benchrun pair`, lab/cmd/benchrun/pair.go, which
# documents it): this builds bin/benchrun and runs it from the repository's
# root. It prints a line per measurement on stderr, then pg-reference's
# medians and a table on stdout. It stops what it starts and drops its
# databases, interrupted or not.
#
# Environment (read by benchrun pair):
#   PAIR_A, PAIR_B       git revisions ("" the working tree; default PAIR_A
#                        HEAD~1, PAIR_B the working tree)
#   PAIR_A_ENV, PAIR_B_ENV  VAR=value words for one side's service
#   PAIR_ROUNDS (3), PAIR_SECONDS (10), PAIR_CLIENTS (16), PAIR_ACCOUNTS (1000)
#   PAIR_RELAY           "on off" (default), "on" or "off"
#   PAIR_EVENTS          1: the p99 of the charges' events, relay on
#   PAIR_OUT             where the JSON lines and logs go (default /tmp/bench-pair.*)
#   NATS_URL             the relay's NATS (default nats://127.0.0.1:4222)
#   PAYMENTS_TEST_DATABASE_URL  a PostgreSQL where this may CREATE DATABASE
#   GO                   the go command (default go)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
export GO
mkdir -p bin
"$GO" -C lab build -o ../bin/benchrun ./cmd/benchrun
exec bin/benchrun pair
