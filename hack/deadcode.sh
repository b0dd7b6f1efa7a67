#!/usr/bin/env bash
# Fails when product code (controller, edge, shared, image) holds a function no binary reaches: dead code, or an
# API only tests use (which belongs in an export_test.go). Test support packages are left out, and
# hack/deadcode-allow.txt names what is kept on purpose, each with its reason.
#
#   hack/deadcode.sh <deadcode binary>
set -euo pipefail

tool=${1:?usage: hack/deadcode.sh <deadcode binary>}
allow=$(dirname "$0")/deadcode-allow.txt

report=$("$tool" -filter '^github.com/outpost-metal/outpost/(controller|edge|shared|image)/' ./... |
	grep -v -E '/(lifecycletest|nettest|internal/fakebmc|internal/ipmisim)/' || true)

failed=0

while IFS= read -r line; do
	[ -z "$line" ] && continue

	dir=$(dirname "${line%%:*}")
	fn=${line##*: }

	if ! grep -q -E "^${dir} ${fn//./\\.} " "$allow"; then
		echo "$line"
		failed=1
	fi
done <<<"$report"

# An allowed function that is reached now, or gone, is taken off the list.
while read -r dir fn _; do
	case "$dir" in '' | '#'*) continue ;; esac

	if ! grep -q -E "^${dir}/[^ ]*: unreachable func: ${fn//./\\.}\$" <<<"$report"; then
		echo "hack/deadcode-allow.txt: $dir $fn is no longer unreachable; remove it from the list"
		failed=1
	fi
done <"$allow"

if [ "$failed" -ne 0 ]; then
	echo "dead code: remove it, or move a test-only API to export_test.go (hack/deadcode-allow.txt for what is kept on purpose)"
	exit 1
fi
