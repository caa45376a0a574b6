#!/usr/bin/env bash
# Keeps the package map of docs/architecture.md true: every arrow it draws is
# an import by a non-test file (go list), and every such import between the
# packages it draws is an arrow. make lint runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
doc=docs/architecture.md

# The mermaid block: node lines `id["path<br/>what it is"]` and arrow lines
# `from --> to & to2`; "payments (openapi.go)" is the module's root package,
# the rest are paths below it.
mod=$(GOWORK=off "$GO" list -m) # go.work would list the client module too
drawn=$(sed -n '/^```mermaid$/,/^```$/p' "$doc" | awk -v mod="$mod" '
	match($0, /^ *[a-z]+\["[^"<]+/) {
		split(substr($0, RSTART, RLENGTH), p, /\["/)
		gsub(/ /, "", p[1]); path = p[2]; sub(/ \(.*/, "", path)
		if (path != "payments") path = mod "/" path; else path = mod
		node[p[1]] = path
	}
	/-->/ {
		split($0, side, /-->/); gsub(/ /, "", side[1])
		n = split(side[2], to, /&/)
		for (i = 1; i <= n; i++) { gsub(/ /, "", to[i]); arrow[side[1] " " to[i]] = 1 }
	}
	END {
		for (id in node) print "node", node[id]
		for (a in arrow) { split(a, e, " "); print "arrow", node[e[1]] " -> " node[e[2]] }
	}')
nodes=$(sed -n 's/^node //p' <<<"$drawn" | sort)
want=$(sed -n 's/^arrow //p' <<<"$drawn" | sort)
got=$("$GO" list -f '{{range .Imports}}{{$.ImportPath}} -> {{.}}{{"\n"}}{{end}}' ./... |
	awk 'NR == FNR { drawn[$1] = 1; next } ($1 in drawn) && ($3 in drawn)' <(echo "$nodes") - | sort)
if [ "$want" != "$got" ]; then
	echo "lint-architecture: the map in $doc differs from the imports (go list); < drawn, > imported:" >&2
	diff <(echo "$want") <(echo "$got") | grep '^[<>]' >&2
	exit 1
fi
echo "lint-architecture: the map's $(wc -l <<<"$nodes") packages and $(wc -l <<<"$want") arrows match go list"
