#!/usr/bin/env bash
# Keeps each shell script short: at most 300 lines, so that logic with
# branches and state lives in Go, where it is tested. make lint
# runs it. A script over the limit that waits to move into Go has a line in
# the table below (none today) and may not grow; when one shrinks, lower or
# drop its line.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=300
declare -A waiting=()

status=0
for f in scripts/*.sh .ci/run; do
	[ -f "$f" ] || continue
	n=$(wc -l <"$f")
	max=${waiting[$f]:-$limit}
	if [ "$n" -gt "$max" ]; then
		if [ "$max" -gt "$limit" ]; then
			echo "lint-sizes: $f has $n lines; it is waiting to move into Go and may not grow past $max" >&2
		else
			echo "lint-sizes: $f has $n lines, over $limit: move its logic into Go (a command or a test) and keep the script a thin wrapper" >&2
		fi
		status=1
	elif [ "$max" -gt "$limit" ] && [ "$n" -lt "$max" ]; then
		echo "lint-sizes: $f shrank to $n lines: lower its line in scripts/lint-sizes.sh to $n (or drop it at $limit or less)" >&2
		status=1
	fi
done
exit $status
