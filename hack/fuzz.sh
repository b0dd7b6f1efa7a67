#!/usr/bin/env bash
# Runs every fuzz target in the module for the given time each (default 30s), on FUZZPARALLEL workers (default:
# all cores), and ends with a table: target, executions, new corpus entries, result. A target that finds a
# crash does not stop the others (Go keeps the input under the package's testdata/fuzz); the script then exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-30s}
parallel=${FUZZPARALLEL:-}

mapfile -t targets < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(' controller edge shared qemu image hack 2>/dev/null |
	while read -r f; do
		for name in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$f" | cut -d' ' -f2); do
			echo "./$(dirname "$f") $name"
		done
	done | sort -u)

if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no targets found" >&2
	exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

table=()
failed=0

for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	echo "=== fuzz $pkg $name ($fuzztime)"

	result=ok
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" ${parallel:+-parallel "$parallel"} "$pkg" 2>&1 | tee "$log"; then
		result=CRASH
		failed=1
	fi

	# The last progress line: "fuzz: elapsed: 30s, execs: 123456 (4115/sec), new interesting: 3 (total: 20)".
	last=$(grep -E 'fuzz: elapsed: .*execs: ' "$log" | tail -1 || true)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	fresh=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
	table+=("$(printf '| %s %s | %s | %s | %s |' "$pkg" "$name" "${execs:--}" "${fresh:--}" "$result")")
done

echo
echo "| target | executions | new corpus entries | result |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${table[@]}"

exit "$failed"
