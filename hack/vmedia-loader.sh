#!/usr/bin/env bash
# Builds the boot loader of the edge's virtual-media images: a standalone GRUB for x86_64 UEFI
# (grub-mkstandalone from Debian's grub-common with grub-efi-amd64-bin's modules), whose embedded
# configuration finds the image's own file system by /outpost/boot.cfg and reads it (edge/vmedia).
# Cached under _out/vmedia-loader/<grub version>/BOOTX64.EFI; nothing built here is ever committed.
#
# Prints the loader's path on stdout. Usage: hack/vmedia-loader.sh [OUT_DIR]   (default: _out/vmedia-loader)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/_out/vmedia-loader}"
modules=/usr/lib/grub/x86_64-efi

command -v grub-mkstandalone >/dev/null || { echo "vmedia-loader: grub-mkstandalone missing (Debian grub-common)" >&2; exit 2; }
[ -d "$modules" ] || { echo "vmedia-loader: $modules missing (Debian grub-efi-amd64-bin)" >&2; exit 2; }

version="$(dpkg-query -W -f='${Version}' grub-efi-amd64-bin 2>/dev/null || echo unknown)"
loader="$out/$version/BOOTX64.EFI"
if [ -s "$loader" ]; then
	echo "$loader"
	exit 0
fi

mkdir -p "$out/$version"
work="$(mktemp -d "$out/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The search walks every device the firmware shows (the CD's ISO 9660 side holds boot.cfg).
cat >"$work/grub.cfg" <<'CFG'
search --no-floppy --file --set=root /outpost/boot.cfg
configfile ($root)/outpost/boot.cfg
CFG

grub-mkstandalone -O x86_64-efi -d "$modules" -o "$work/BOOTX64.EFI" \
	--modules="part_gpt part_msdos iso9660 fat search search_fs_file configfile normal linux echo test efi_gop all_video" \
	--locales= --fonts= --themes= "boot/grub/grub.cfg=$work/grub.cfg" >&2

mv "$work/BOOTX64.EFI" "$loader"
echo "$loader"
