#!/usr/bin/env bash
# Installs the Debian packages Outpost's tests, lab and benchmarks use, when any is missing.
# Needs root; without root it says what is missing and lets the tests skip what needs them.
set -euo pipefail

packages=(protobuf-compiler libprotobuf-dev iproute2 qemu-system-x86 ipxe-qemu ovmf dnsmasq-base busybox-static
	ipmitool openipmi redfishtool nginx-light tftp-hpa cpio chromium skopeo
	binutils sbsigntool openssl systemd-boot-efi isc-dhcp-relay python3-sushy-cli qemu-block-extra xorriso mtools grub-efi-amd64-bin grub-common iptables
	binutils-aarch64-linux-gnu qemu-efi-aarch64 qemu-system-arm make)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: not root, cannot install: ${missing[*]} (lab tests that need them will skip)" >&2
	exit 0
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
