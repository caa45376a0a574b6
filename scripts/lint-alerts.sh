#!/usr/bin/env bash
# Checks the Prometheus alerting rules in deploy/prometheus: `promtool check
# rules` (syntax, PromQL) and `promtool test rules` (each rule's unit tests in
# alerts_test.yml). make lint runs it.
#
# promtool comes with Prometheus (Debian/Ubuntu: apt-get install -y prometheus).
# Without it the check is skipped with a warning; under CI=true it fails.
set -euo pipefail
cd "$(dirname "$0")/../deploy/prometheus"

if ! command -v promtool >/dev/null 2>&1; then
	if [ "${CI:-}" = true ]; then
		echo 'lint-alerts: promtool not found, and CI=true: install it (apt-get install -y prometheus)' >&2
		exit 1
	fi
	echo 'lint-alerts: SKIPPED, the alerting rules were NOT checked: promtool not found.' >&2
	echo '  Install it (Debian/Ubuntu: sudo apt-get install -y prometheus) and run make lint again.' >&2
	exit 0
fi
promtool check rules alerts.yml
promtool test rules alerts_test.yml
