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

# shellcheck source=hack/debian-apt.sh
. "$root/hack/debian-apt.sh"
debian_apt_setup "$out/apt" arm64 '{ print }'

pkg="$(apt-cache "${apt_opts[@]}" depends linux-image-cloud-arm64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')"
[ -n "$pkg" ] || { echo "kernel-arm64: linux-image-cloud-arm64 names no linux-image package" >&2; exit 2; }

work="$out/download"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && apt-get "${apt_opts[@]}" -qq download "$pkg:arm64" systemd-boot-efi:arm64 >&2)
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
