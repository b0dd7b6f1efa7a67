#!/usr/bin/env bash
# Fetches Debian's iPXE, the boot files the edge serves to every firmware (undionly.kpxe and ipxe.pxe for BIOS,
# ipxe.efi and snponly.efi for x86 UEFI, snp-arm64.efi for arm64 UEFI), and caches them under
# _out/ipxe/<suite>/, with SOURCE naming the package version. The appliance ships this directory and the lab's
# edges serve it; nothing fetched here is ever committed.
#
# The package is the ipxe of Debian suite IPXE_SUITE (default trixie), from the mirrors this machine's apt
# already uses, unpacked, not installed. Bookworm's ipxe (2019) is x86 only, and its ipxe.efi never hands a
# machine back to OVMF when the boot script exits to the disk; trixie's (2025) does, and carries Debian's own
# arm64 build (ipxe-arm64.efi, made from the same source with Debian's aarch64 cross compiler).
#
# Prints the directory on stdout; a second call with it present returns at once without the network.
# Usage: hack/ipxe.sh [OUT_DIR]   (default: _out/ipxe)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/_out/ipxe}"
suite="${IPXE_SUITE:-trixie}"
dir="$out/$suite"
# The edge's names, and the package's file for each.
declare -A files=([undionly.kpxe]=undionly.kpxe [ipxe.pxe]=ipxe.pxe [ipxe.efi]=ipxe-amd64.efi
	[snponly.efi]=snponly.efi [snp-arm64.efi]=ipxe-arm64.efi)

have() {
	local name
	[ -s "$dir/SOURCE" ] || return 1
	for name in "${!files[@]}"; do
		[ -s "$dir/$name" ] || return 1
	done
}

if have; then
	echo "$dir"
	exit 0
fi

# Test packages run in parallel, and several may ask at once on a fresh machine: one fetches, the others wait
# for it and find the files.
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if have; then
	echo "$dir"
	exit 0
fi

# shellcheck source=hack/debian-apt.sh
. "$root/hack/debian-apt.sh"
# The release suites (not -updates or -security) of the archives apt uses here, renamed to $suite.
debian_apt_setup "$out/apt" amd64 "\$2 !~ /-/ { print \$1 \" $suite main\" }"

work="$out/download"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && apt-get "${apt_opts[@]}" -qq download ipxe >&2)
deb="$(find "$work" -maxdepth 1 -name 'ipxe_*_all.deb' | head -n1)"
[ -n "$deb" ] || { echo "ipxe: no ipxe package downloaded from Debian $suite" >&2; exit 2; }
dpkg-deb -x "$deb" "$work/root"

rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
for name in "${!files[@]}"; do
	src="$work/root/usr/lib/ipxe/${files[$name]}"
	[ -s "$src" ] || { echo "ipxe: $(basename "$deb") carries no ${files[$name]}" >&2; exit 2; }
	cp -L "$src" "$dir.tmp/$name"
done
echo "Debian $suite ipxe $(dpkg-deb -f "$deb" Version)" >"$dir.tmp/SOURCE"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
rm -rf "$work"
echo "$dir"
