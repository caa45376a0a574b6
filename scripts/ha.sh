#!/usr/bin/env bash
# ha.sh: a PostgreSQL HA cluster on this machine (etcd and three Patroni
# members, deploy/ha), for development and the failover tests; make ha-up,
# ha-down, ha-status and chaos-ha call it. The work is lab/cmd/hacluster's (go
# doc ./lab/cmd/hacluster): this builds it into bin/hacluster and runs it.
#
#   ha.sh up|down|status|wait|url|api|primary|standby|pid MEMBER|ctl ARGS...
#
# Environment: HA_DIR (default /var/tmp/payments-ha), HA_WAIT (default 90 s),
# HA_PG_PORT, HA_PATRONI_PORT, HA_ETCD_PORT (default 5441, 8441, 23790: the
# cluster's ports, lab/README.md), GO (default go).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# -C: build from the lab module without leaving the caller's directory, where
# `ha.sh ctl` arguments may name files.
"${GO:-go}" -C "$repo/lab" build -o ../bin/hacluster ./cmd/hacluster
exec "$repo/bin/hacluster" "$@"
