#!/usr/bin/env bash
# Runs every fuzz target in the module for the given time each (default 30s).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-30s}

mapfile -t targets < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(' controller edge shared qemu image 2>/dev/null |
	while read -r f; do
		for name in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$f" | cut -d' ' -f2); do
			echo "./$(dirname "$f") $name"
		done
	done | sort -u)

if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no targets found" >&2
	exit 1
fi

for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	echo "=== fuzz $pkg $name ($fuzztime)"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"
done
