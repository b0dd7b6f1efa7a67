#!/usr/bin/env bash
# Builds arm64 iPXE (bin-arm64-efi/snp.efi and ipxe.efi) from Debian's ipxe source package with Debian's
# aarch64 cross compiler, and caches it under _out/ipxe-arm64/<debian version>/. Debian's ipxe binary
# package is x86 only; nothing built here is ever committed.
#
# The source comes from the Debian mirrors this machine's apt already uses: a private apt configuration
# (under _out, never touching the system's) holds deb-src lines for the same mirrors and suites.
# The version is the installed ipxe package's, so the arm64 files match the x86 ones; a second call with the
# cache present returns at once without touching the network.
#
# Prints the cache directory on stdout. Usage: hack/ipxe-arm64.sh [OUT_DIR]   (default: _out/ipxe-arm64)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/_out/ipxe-arm64}"
cross="${CROSS:-aarch64-linux-gnu-}"

version="$(dpkg-query -W -f='${Version}' ipxe 2>/dev/null || true)"
if [ -n "$version" ] && [ -s "$out/$version/snp.efi" ] && [ -s "$out/$version/ipxe.efi" ]; then
	echo "$out/$version"
	exit 0
fi

command -v "${cross}gcc" >/dev/null || { echo "ipxe-arm64: ${cross}gcc missing (hack/deps.sh installs gcc-aarch64-linux-gnu)" >&2; exit 2; }
command -v dpkg-source >/dev/null || { echo "ipxe-arm64: dpkg-source missing (dpkg-dev)" >&2; exit 2; }

apt="$out/apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
list="$apt/sources.list"
: >"$list"
# deb822 stanzas of the system's Debian sources, turned into deb-src one-line entries.
for f in /etc/apt/sources.list.d/*.sources; do
	[ -e "$f" ] || continue
	awk -v out="$list" '
		function flush() {
			if (types ~ /(^| )deb( |$)/ && signed ~ /debian-archive-keyring/)
				for (i = 1; i <= nu; i++) {
					ns = split(suites, st, /[ \t]+/)
					for (j = 1; j <= ns; j++) print "deb-src [signed-by=" signed "] " u[i] " " st[j] " " comps >> out
				}
			types = ""; signed = ""; suites = ""; comps = ""; nu = 0
		}
		/^[ \t]*$/ { flush(); next }
		/^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
		/^URIs:/ { sub(/^URIs:[ \t]*/, ""); nu = split($0, u, /[ \t]+/) }
		/^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
		/^Components:/ { sub(/^Components:[ \t]*/, ""); comps = $0 }
		/^Signed-By:/ { sub(/^Signed-By:[ \t]*/, ""); signed = $0 }
		END { flush() }
	' "$f"
done
# One-line entries signed by Debian's archive key (or the plain sources.list of a Debian install).
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
	[ -e "$f" ] || continue
	grep -E '^deb[[:space:]]' "$f" | grep -E 'debian' | sed -E 's/^deb([[:space:]])/deb-src\1/' >>"$list" || true
done
[ -s "$list" ] || { echo "ipxe-arm64: no Debian apt source configured on this machine" >&2; exit 2; }

aptopts=(-o "Dir::Etc::sourcelist=$list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$apt/lists"
	-o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${aptopts[@]}" -qq update >&2

if [ -z "$version" ]; then
	version="$(apt-cache "${aptopts[@]}" showsrc ipxe | awk '/^Version:/ { print $2; exit }')"
	[ -n "$version" ] || { echo "ipxe-arm64: no ipxe source package found" >&2; exit 2; }
	if [ -s "$out/$version/snp.efi" ] && [ -s "$out/$version/ipxe.efi" ]; then
		echo "$out/$version"
		exit 0
	fi
fi

work="$out/build-$version"
tmp="$out/.tmp-$version"
rm -rf "$work" "$tmp"
mkdir -p "$work" "$tmp"
if (cd "$work" && apt-get "${aptopts[@]}" -qq source "ipxe=$version" >&2); then
	src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'ipxe-*' | head -n1)"
	[ -n "$src" ] || { echo "ipxe-arm64: apt-get source left no ipxe directory in $work" >&2; exit 2; }
	jobs="$(nproc 2>/dev/null || echo 1)"
	make -C "$src/src" -j"$jobs" CROSS="$cross" NO_WERROR=1 bin-arm64-efi/snp.efi bin-arm64-efi/ipxe.efi >&2
	cp "$src/src/bin-arm64-efi/snp.efi" "$src/src/bin-arm64-efi/ipxe.efi" "$tmp/"
	echo "Debian ipxe $version (source package, built with ${cross}gcc)" >"$tmp/SOURCE"
else
	# Some mirrors serve a suite's packages but not its source tarballs. The next Debian suite's ipxe package
	# (architecture all) is built by Debian with the same aarch64 cross compiler and carries ipxe-arm64.efi:
	# take that one, from the same mirrors, and say so.
	next="${IPXE_ARM64_SUITE:-trixie}"
	echo "ipxe-arm64: the mirror serves no ipxe $version source; taking ipxe-arm64.efi from Debian's $next ipxe package" >&2
	# The suites without a dash are the releases themselves (not -updates, -security).
	awk -v next_="$next" '$1 == "deb-src" && $4 !~ /-/ { print "deb " $2 " " $3 " " next_ " main" }' "$list" | sort -u >"$apt/next.list"
	nextopts=(-o "Dir::Etc::sourcelist=$apt/next.list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$apt/lists-next"
		-o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root" -o "APT::Architectures=amd64" -o "APT::Architectures::=amd64")
	mkdir -p "$apt/lists-next/partial"
	apt-get "${nextopts[@]}" -qq update >&2 || true
	(cd "$work" && apt-get "${nextopts[@]}" -qq download ipxe >&2)
	deb="$(find "$work" -maxdepth 1 -name 'ipxe_*_all.deb' | head -n1)"
	[ -n "$deb" ] || { echo "ipxe-arm64: no ipxe package downloaded from $next" >&2; exit 2; }
	dpkg-deb -x "$deb" "$work/root"
	[ -s "$work/root/usr/lib/ipxe/ipxe-arm64.efi" ] || { echo "ipxe-arm64: $deb carries no ipxe-arm64.efi" >&2; exit 2; }
	# Debian's arm64 ipxe.efi holds the SNP driver too: it serves both names.
	cp "$work/root/usr/lib/ipxe/ipxe-arm64.efi" "$tmp/ipxe.efi"
	cp "$work/root/usr/lib/ipxe/ipxe-arm64.efi" "$tmp/snp.efi"
	echo "Debian $next ipxe $(dpkg-deb -f "$deb" Version) (binary package, ipxe-arm64.efi)" >"$tmp/SOURCE"
fi
rm -rf "${out:?}/$version"
mv "$tmp" "$out/$version"
rm -rf "$work"
echo "$out/$version"
