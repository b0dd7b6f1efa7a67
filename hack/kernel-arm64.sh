#!/usr/bin/env bash
# Fetches Debian's arm64 cloud kernel (linux-image-cloud-arm64's linux-image dependency, an arm64-architecture
# package) and systemd-boot-efi:arm64 (its UKI stub, linuxaa64.efi.stub) and unpacks them, not installed, under
# _out/bootlab-arm64/root: the boot lab's arm64 machines boot its vmlinuz with an initramfs of its virtio
# modules, and their disks a UKI made with that stub. The host's dpkg architectures are left alone: a private apt
# configuration under _out lists the same Debian mirrors for arm64 only. Nothing fetched here is committed.
#
# Prints the unpacked root on stdout; a second call with it present returns at once without the network.
# Usage: hack/kernel-arm64.sh [OUT_DIR]   (default: _out/bootlab-arm64)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/_out/bootlab-arm64}"

have() {
	compgen -G "$out/root/boot/vmlinuz-*-cloud-arm64" >/dev/null && compgen -G "$out/root/lib/modules/*-cloud-arm64" >/dev/null &&
		[ -s "$out/root/usr/lib/systemd/boot/efi/linuxaa64.efi.stub" ]
}

if have; then
	echo "$out/root"
	exit 0
fi

apt="$out/apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
list="$apt/sources.list"
: >"$list"
# The system's Debian sources (deb822 stanzas and one-line entries), as one-line arm64 entries.
for f in /etc/apt/sources.list.d/*.sources; do
	[ -e "$f" ] || continue
	awk -v out="$list" '
		function flush() {
			if (types ~ /(^| )deb( |$)/ && signed ~ /debian-archive-keyring/)
				for (i = 1; i <= nu; i++) {
					ns = split(suites, st, /[ \t]+/)
					for (j = 1; j <= ns; j++) print "deb [arch=arm64 signed-by=" signed "] " u[i] " " st[j] " " comps >> out
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
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
	[ -e "$f" ] || continue
	grep -E '^deb[[:space:]]+[^[]' "$f" | grep -E 'debian' | sed -E 's/^deb[[:space:]]+/deb [arch=arm64] /' >>"$list" || true
done
[ -s "$list" ] || { echo "kernel-arm64: no Debian apt source configured on this machine" >&2; exit 2; }

aptopts=(-o "Dir::Etc::sourcelist=$list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$apt/lists"
	-o "Dir::Cache=$apt/cache" -o "Dir::State::status=/dev/null" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root"
	-o "APT::Architecture=arm64" -o "APT::Architectures::=arm64")
apt-get "${aptopts[@]}" -qq update >&2

pkg="$(apt-cache "${aptopts[@]}" depends linux-image-cloud-arm64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')"
[ -n "$pkg" ] || { echo "kernel-arm64: linux-image-cloud-arm64 names no linux-image package" >&2; exit 2; }

work="$out/download"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && apt-get "${aptopts[@]}" -qq download "$pkg:arm64" systemd-boot-efi:arm64 >&2)
[ "$(find "$work" -maxdepth 1 -name '*_arm64.deb' | wc -l)" = 2 ] || { echo "kernel-arm64: apt-get download $pkg systemd-boot-efi left no two .debs" >&2; exit 2; }

rm -rf "$out/root.tmp"
for deb in "$work"/*_arm64.deb; do
	dpkg-deb -x "$deb" "$out/root.tmp"
done
rm -rf "$out/root"
mv "$out/root.tmp" "$out/root"
rm -rf "$work"
have || { echo "kernel-arm64: $pkg and systemd-boot-efi hold no cloud-arm64 kernel and UKI stub" >&2; exit 2; }
echo "$out/root"
