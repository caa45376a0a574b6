#!/usr/bin/env bash
# Fails when a rule of deploy/prometheus/alerts.yml or a query of
# deploy/grafana/payments.json names a metric that the service does not
# export. make lint runs it.
#
# The check is a Go test (cmd/payments/metricnames_test.go): it starts serve,
# relay and consume for real through the program's run function, on a fresh
# PostgreSQL database (internal/pgtest: PAYMENTS_TEST_DATABASE_URL, else a
# Docker-compatible engine, else 127.0.0.1:5432) and an embedded NATS, sends
# some traffic, reads their /metrics, and compares every metric name the
# PromQL of those files selects (a tokenizer, tested by TestPromQLMetricNames)
# with the names they export. Also checked: the dashboard's shape for import
# (TestDashboardIsImportable). About 10 seconds once built.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
exec "$GO" test -count=1 -run '^(TestPromQLMetricNames|TestRulesAndDashboardNameExportedMetrics|TestDashboardIsImportable)$' ./cmd/payments/
