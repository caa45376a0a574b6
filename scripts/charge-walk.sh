#!/usr/bin/env bash
# charge-walk.sh check|write: the functions of this module that one fresh
# charge runs, and the block of docs/architecture.md that lists them.
#
#   check  (make lint)         fails when the block differs from the walk
#   write  (make charge-walk)  rewrites the block, then prints it
#
# The work is TestChargeWalk's (internal/e2e/chargewalk_test.go, built only
# with -tags chargewalk): it builds internal/e2e/testdata/chargewalk with
# coverage, runs one charge through it and reads the counters. The database
# is internal/pgtest's, as for every test (PAYMENTS_TEST_DATABASE_URL, else a
# Docker-compatible engine, else 127.0.0.1:5432), dropped after.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

case ${1:-} in
check) update=0 ;;
write) update=1 ;;
*)
	echo "usage: $0 check|write" >&2
	exit 2
	;;
esac
# The program is under testdata, where go vet ./... and golangci-lint do not
# look; the test builds it, and this vets it.
"$GO" vet ./internal/e2e/testdata/chargewalk
UPDATE_CHARGE_WALK=$update "$GO" test -count=1 -tags chargewalk -run '^TestChargeWalk$' ./internal/e2e/
if [ "$update" = 1 ]; then
	sed -n '/^<!-- charge-walk:begin/,/^<!-- charge-walk:end -->$/p' docs/architecture.md
fi
