#!/usr/bin/env bash
# test.sh: every test under the race detector (`make test` calls it), then a
# summary: each package's result, and every skipped test with its reason, so
# that a skip (the browser test without Chromium) is never mistaken for a pass.
#
# Arguments are passed to go test before the package list (make test
# TESTFLAGS='-run TestCharge'). The exit status is go test's.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

GO=${GO:-go}
log=$(mktemp "${TMPDIR:-/tmp}/payments-test.XXXXXX")
trap 'rm -f "$log"' EXIT

# -v prints each package's "pgtest: ..." line naming the PostgreSQL it used.
# The fault scenarios (internal/chaos) run after the other packages, alone:
# some of them compare throughput before and after a fault, and another
# package's tests on the same two CPUs made that comparison measure them.
started=$(date +%s)
others=$($GO list ./... | grep -v '/internal/chaos$')
# shellcheck disable=SC2086 # one package path per word
$GO test -race -count=1 -v "$@" $others 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The Go client is its own module (client/go.mod); its tests that need the
# service live in internal/clienttest, in the list above.
(cd client && $GO test -race -count=1 -v "$@" ./...) 2>&1 | tee -a "$log"
clientmod=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$clientmod
# The lab (benchmarks, load generator, HA cluster runner, tools) is its own
# module too (lab/go.mod); its tests print a "labtest: ..." line naming their
# PostgreSQL.
(cd lab && $GO test -race -count=1 -v "$@" ./...) 2>&1 | tee -a "$log"
labmod=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$labmod
$GO test -race -count=1 -v "$@" ./internal/chaos/ 2>&1 | tee -a "$log"
chaos=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$chaos
elapsed=$(($(date +%s) - started))

echo
echo "==================================================================================="
echo "make test summary ($((elapsed / 60))m$((elapsed % 60))s)"
grep -E '^(ok|FAIL)[[:space:]]+[^[:space:]]' "$log" | sed 's/^/  /'
grep -E '^(pg|lab)test: ' "$log" | sed -E 's/; database .*//' | sort | uniq -c | sed 's/^ */  /'
# go test -v prints a test's log lines before its "--- SKIP" line: keep the
# lines since the test's "=== RUN" and print them with the skip.
skips=$(awk '
	/^=== (RUN|CONT|PAUSE|NAME)/ { name = $3; reason = ""; next }
	/^ +--- SKIP: / || /^--- SKIP: / { printf "  SKIPPED %s\n%s", $3, reason; reason = ""; next }
	/^    [^ ]/ { reason = reason "      " substr($0, 5) "\n" }
' "$log")
if [ -n "$skips" ]; then
	echo
	echo "Skipped tests (these did NOT pass; each says what it needs: a tool to install, a server setting, or"
	echo "make chaos-ha, whose Patroni cluster runs the failover scenarios):"
	printf '%s\n' "$skips"
fi
fails=$(grep -E '^ *--- FAIL: ' "$log" | sed 's/^ */  /')
if [ -n "$fails" ]; then
	echo
	echo "Failed tests:"
	printf '%s\n' "$fails"
fi
if [ "$status" -eq 0 ]; then
	echo "RESULT: PASS"
else
	echo "RESULT: FAIL (go test exit status $status)"
fi
echo "==================================================================================="
exit "$status"
