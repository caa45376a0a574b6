#!/usr/bin/env bash
# mutants.sh: mutation testing with gremlins (`make mutants` calls it). Gremlins
# changes one operator at a time in a package (< to <=, + to -, == to !=, && to
# ||, ...), runs the tests, and reports each change as KILLED (a test failed),
# LIVED (every test passed: a hole in the tests, or an equivalent change),
# NOT COVERED (no test runs that line) or TIMED OUT. docs/reliability.md
# ("Mutation testing") holds the latest score and the reasons for every survivor.
#
#   scripts/mutants.sh                       the four packages below, in turn
#   scripts/mutants.sh internal/idempotency  only the packages named
#
# The tests of all four packages run against every mutant, whichever package it
# is in: internal/postgres is exercised mostly by internal/httpapi's tests, so a
# package's own tests alone would call most of its mutants survivors (gremlins'
# integration mode, --coverpkg naming the four). go test ./... would also run
# the slow packages (internal/chaos builds and kills the binary, internal/e2e
# drives Chromium, cmd/...) for each of hundreds of mutants, so the run happens
# in a scratch copy of the tracked files in which every other package's
# *_test.go is deleted; the checkout itself is never touched. Packages that do
# not import the mutated one come from go's test cache.
#
# Needs what make test needs: PostgreSQL for pgtest (127.0.0.1:5432, trust, user
# postgres, or PAYMENTS_TEST_DATABASE_URL); the relay tests start their own NATS.
# With a Docker engine and no PAYMENTS_TEST_DATABASE_URL, pgtest would start a
# container for every package of every mutant's run: name a server instead.
#
# Writes to MUTANTS_OUT (default ./mutants, ignored by git): <package>.json
# (gremlins' machine-readable results), <package>.log, and summary.txt with each
# package's counts and every mutant not killed with its line of code.
#
# Environment: MUTANTS_WORKERS (mutants tested at once, default 1: each runs
# the packages' tests two at a time, and the in-flight tests bound their waits
# from above, so an overloaded machine would count as kills), and
# MUTANTS_TIMEOUT_COEFFICIENT (a mutant's test run may take this many times the
# unmutated run before it counts as TIMED OUT, default 5), MUTANTS_EXCLUDE (a
# regular expression of file paths gremlins leaves alone, to finish a run that
# was stopped part way, e.g. 'auth|charges|compress' to test the rest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

GO=${GO:-go}
# Pinned, built from the module proxy on first use, then from the build cache
# (as golangci-lint is in the Makefile).
GREMLINS=${GREMLINS:-"$GO run github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0"}
workers=${MUTANTS_WORKERS:-1}
coefficient=${MUTANTS_TIMEOUT_COEFFICIENT:-5}
exclude=()
if [ -n "${MUTANTS_EXCLUDE:-}" ]; then
	exclude=(--exclude-files "$MUTANTS_EXCLUDE")
fi
out=${MUTANTS_OUT:-$root/mutants}

# The packages whose tests run against every mutant, and the default targets.
tested=(internal/idempotency internal/postgres internal/httpapi internal/relay)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	targets=("${tested[@]}")
fi
module=$(GOWORK=off $GO list -m) # go.work would list the client module too
coverpkg=$(printf "$module/%s," "${tested[@]}")
coverpkg=${coverpkg%,}

for pkg in "${targets[@]}"; do
	pkg=${pkg#./}
	pkg=${pkg%/}
	if [ ! -d "$pkg" ]; then
		echo "mutants: no package directory $pkg" >&2
		exit 2
	fi
done

# The operators gremlins changes by default (arithmetic, comparison boundaries
# and negations, ++/--, unary minus) and those that matter for money and
# control flow: && and ||, += and -=, break and continue.
mutators=(--invert-logical --invert-assignments --remove-self-assignments --invert-loopctrl)

scratch=$(mktemp -d "${TMPDIR:-/tmp}/payments-mutants.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$out"

# A snapshot of the tracked files as they are in the working tree now (a
# tracked file deleted there is left out), so that edits made during the run
# do not reach it, with the tests of every package but the four deleted.
snapshot="$scratch/tree"
mkdir -p "$snapshot"
git ls-files -z | while IFS= read -r -d '' f; do
	if [ -e "$f" ]; then printf '%s\0' "$f"; fi
done | tar --null --files-from=- -cf - | tar -xf - -C "$snapshot"
keep=()
for pkg in "${tested[@]}"; do
	keep+=(-not -path "./$pkg/*")
done
(cd "$snapshot" && find . -name '*_test.go' "${keep[@]}" -delete)

started=$(date +%s)
for pkg in "${targets[@]}"; do
	pkg=${pkg#./}
	pkg=${pkg%/}
	name=${pkg//\//_}
	# A fresh copy per package: go test caches a coverage run, and a cached
	# run's few milliseconds would become every mutant's time limit.
	dst="$scratch/$name"
	cp -a "$snapshot" "$dst"
	echo "mutants: $pkg (log: $out/$name.log)"
	pkgstart=$(date +%s)
	status=0
	# Gremlins mutates the package it is started in; it finds no module when
	# given a relative path (v0.6.0), so it is given none.
	(cd "$dst/$pkg" && $GREMLINS unleash --integration --coverpkg "$coverpkg" \
		--workers "$workers" --timeout-coefficient "$coefficient" "${mutators[@]}" "${exclude[@]}" \
		--output "$out/$name.json") >"$out/$name.log" 2>&1 || status=$?
	tail -n 6 "$out/$name.log"
	echo "mutants: $pkg took $(($(date +%s) - pkgstart))s"
	if [ "$status" -ne 0 ]; then
		echo "mutants: gremlins failed on $pkg (exit $status); see $out/$name.log" >&2
		exit "$status"
	fi
	# Every mutant not killed, with its line of code, read from the copy that
	# was tested.
	jq -r '.files[] | .file_name as $f | .mutations[]
		| select(.status == "LIVED" or .status == "TIMED OUT" or .status == "NOT COVERED")
		| [.status, $f, .line, .column, .type] | @tsv' "$out/$name.json" |
		sort -t$'\t' -k2,2 -k3,3n -k4,4n |
		while IFS=$'\t' read -r st file line column type; do
			code=$(sed -n "${line}p" "$dst/$pkg/$file" | sed 's/^[[:space:]]*//')
			printf '%-9s %s:%s:%s %s\n          %s\n' "$st" "$pkg/$file" "$line" "$column" "$type" "$code"
		done >"$out/$name.survivors"
	rm -rf "$dst"
done
elapsed=$(($(date +%s) - started))

# summary.txt: one row per package, then every survivor with its code.
{
	echo "make mutants: gremlins v0.6.0, $(date -u +%Y-%m-%d), ${elapsed}s ($((elapsed / 60))m$((elapsed % 60))s), workers $workers, timeout coefficient $coefficient"
	printf '%-22s %7s %6s %12s %10s %11s %9s %15s\n' package killed lived 'not covered' 'timed out' 'not viable' efficacy 'mutant coverage'
	for pkg in "${targets[@]}"; do
		pkg=${pkg#./}
		pkg=${pkg%/}
		jq -r --arg pkg "$pkg" '
			[.files[].mutations[].status] as $s
			| def n(x): [$s[] | select(. == x)] | length;
			  (n("KILLED")) as $k | (n("LIVED")) as $l | (n("NOT COVERED")) as $c
			| [$pkg, $k, $l, $c, n("TIMED OUT"), n("NOT VIABLE"),
			   (if $k + $l > 0 then ($k * 10000 / ($k + $l) | round) / 100 else 0 end),
			   (if $k + $l + $c > 0 then (($k + $l) * 10000 / ($k + $l + $c) | round) / 100 else 0 end)]
			| @tsv' "$out/${pkg//\//_}.json"
	done | awk -F'\t' '{ printf "%-22s %7d %6d %12d %10d %11d %8.2f%% %14.2f%%\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
	echo
	echo "Mutants not killed (LIVED, TIMED OUT, NOT COVERED):"
	for pkg in "${targets[@]}"; do
		pkg=${pkg#./}
		pkg=${pkg%/}
		cat "$out/${pkg//\//_}.survivors"
	done
} >"$out/summary.txt"
cat "$out/summary.txt"
